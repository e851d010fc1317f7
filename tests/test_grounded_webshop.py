"""The grounded policy's web shop reader: its reading of instructions and pages on canned observations, every web
shop task through the real engine (success per template, printed with ``pytest -s``), and a corrupted observation
changing its answer and its reward."""

from __future__ import annotations

import collections
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from bunshin.engine.rollout import RolloutEngine
from bunshin.envs.suites.base import SuiteTask
from bunshin.envs.webshop.suite import WebShopSuite
from bunshin.policies.base import PolicyContext
from bunshin.policies.grounded import GroundedPolicy
from bunshin.policies.grounded import webshop as reader
from bunshin.policies.grounded.webshop_page import parse_view, visit

from .conftest import assert_no_leaks
from .test_grounded_policy import Tripwire

KINDS = {"review_count": "reviews", "product_attribute": "attribute", "cheapest_in_category": "cheapest",
         "order_total": "order_total", "search_for": "search", "category_sorted": "sorted", "add_to_cart": "cart",
         "checkout": "buy", "write_review": "review", "unachievable": "price"}
INFEASIBLE = {"unachievable"}  # the product asked about does not exist: the right answer is N/A
HEADER = """\t[10] listitem ''
\t\t[11] link 'My Account'
\t[16] link 'One Stop Market'
\t[19] textbox 'Search entire store here...' required: False
\t[20] button 'Search'"""
PRODUCT_TOP = f"""Tab 0 (current): Orchid Card Game R812

[1] RootWebArea 'Orchid Card Game R812' focused: True
{HEADER}
\t[23] heading 'Orchid Card Game R812'
\t[31] StaticText '$10.65'
\t[39] StaticText 'Rating: 5.0'
\t[40] link '3 Reviews'
\t[45] StaticText 'Qty'
\t[46] textbox '1' required: False
\t[47] button 'Add to Cart'
\t(... 9 lines below; scroll down to see them)"""
PRODUCT_BOTTOM = """Tab 0 (current): Orchid Card Game R812

[1] RootWebArea 'Orchid Card Game R812' focused: True
\t(... 10 lines above; scroll up to see them)
\t[46] textbox '1' required: False
\t[47] button 'Add to Cart'
\t[51] table ''
\t\t[52] row 'Color Gray'
\t\t\t[53] rowheader 'Color'
\t\t\t[55] cell 'Gray'
\t[68] heading 'Customer Reviews'
\t[94] StaticText 'Nickname'
\t[95] textbox 'Nickname' required: False
\t[106] StaticText 'Related Products'
\t[113] StaticText '$7.30'"""
NO_SUCH = f"""Tab 0 (current): Search results for: 'Orchid Card Game Z9999'

[1] RootWebArea "Search results for: 'Orchid Card Game Z9999'" focused: True
{HEADER}
\t[23] heading "Search results for: 'Orchid Card Game Z9999'"
\t[27] StaticText '2 items'
\t[30] listitem ''
\t\t[32] link 'Orchid Card Game R812'
\t\t[35] StaticText '$10.65'
\t[41] listitem ''
\t\t[43] link 'Orchid Card Game N634'
\t\t[46] StaticText '$17.83'"""


def ctx_for(instruction: str, observations: list[str], actions: list[str]) -> PolicyContext:
    return PolicyContext(suite="webshop", task_id="0", group_id="0:0", sample=0, seed=1, instruction=instruction,
                         reference=Tripwire(), observations=observations, actions=actions, step=len(actions))


def test_every_instruction_of_the_shop_is_understood() -> None:
    for task in WebShopSuite().tasks():
        goal = reader.read_goal(task.instruction)
        assert goal is not None and goal.kind == KINDS[task.template], task.instruction
    goal = reader.read_goal("Buy Orchid Card Game R812 and ship it to Ada Lovelace, 1 Main St, New York, New York "
                            "10001, United States (phone 2125550100)")
    assert goal is not None and (goal["first"], goal["last"], goal["region"], goal["postcode"], goal["phone"]) == (
        "Ada", "Lovelace", "New York", "10001", "2125550100")
    assert reader.act(ctx_for("Sing me a song", [PRODUCT_TOP], [])) == "stop [N/A]"


def test_a_visit_merges_what_scrolling_showed_and_seeks_the_rest() -> None:
    view = parse_view(PRODUCT_TOP)
    assert view is not None and view.root.name == "Orchid Card Game R812" and view.total == 21
    assert parse_view("ERROR: there is no element [999] on this page\n") is None
    top = visit([PRODUCT_TOP], [])
    assert top is not None and len(top.lines) < top.total
    assert top.seek(lambda n: n.role == "rowheader") == "scroll [down]"
    both = visit([PRODUCT_TOP, PRODUCT_BOTTOM], ["scroll [down]"])
    assert both is not None and len(both.lines) >= both.total and both.find(lambda n: n.name == "$10.65") is not None
    assert both.seek(lambda n: n.name == "no such thing") is None
    # an action that navigates starts a new visit; a failed one does not
    assert (page := visit([PRODUCT_TOP, PRODUCT_BOTTOM], ["click [40]"])) is not None and len(page.lines) < page.total
    failed = visit([PRODUCT_TOP, "ERROR: there is no element [999] on this page\n"], ["click [999]"])
    assert failed is not None and failed.latest.root.name == "Orchid Card Game R812"
    # a field typed into out of view holds what was typed, though no view has shown it since
    typed = visit([PRODUCT_BOTTOM, PRODUCT_TOP, PRODUCT_TOP], ["scroll [up]", "type [95] [sam] [0]"])
    box = typed.find(lambda n: n.id == 95) if typed is not None else None
    assert typed is not None and box is not None and typed.value(box) == "sam"


def test_answers_are_read_off_the_page_wherever_the_viewport_is() -> None:
    product = "Orchid Card Game R812"
    for observations, actions in [([PRODUCT_TOP], []), ([PRODUCT_TOP, PRODUCT_BOTTOM], ["scroll [down]"])]:
        assert reader.act(ctx_for(f"How many reviews does {product} have?", observations, actions)) == "stop [3]"
        assert reader.act(ctx_for(f"What is the price of the {product}?", observations, actions)) == "stop [$10.65]"
    # the attribute table is below the first screen: scroll to it, then read it (after a detour back up too)
    question = f"What is the color of {product}?"
    assert reader.act(ctx_for(question, [PRODUCT_TOP], [])) == "scroll [down]"
    assert reader.act(ctx_for(question, [PRODUCT_TOP, PRODUCT_BOTTOM], ["scroll [down]"])) == "stop [Gray]"
    assert reader.act(ctx_for(question, [PRODUCT_TOP, PRODUCT_BOTTOM, PRODUCT_TOP],
                              ["scroll [down]", "scroll [up]"])) == "stop [Gray]"
    assert reader.act(ctx_for("Add 2 of Orchid Card Game R812 to my cart", [PRODUCT_TOP], [])) == "type [46] [2] [0]"


def test_a_product_the_search_does_not_find_is_given_up() -> None:
    question = "What is the price of the Orchid Card Game Z9999?"
    assert reader.act(ctx_for(question, [PRODUCT_TOP], [])) == "type [19] [Orchid Card Game Z9999] [1]"
    assert reader.act(ctx_for(question, [PRODUCT_TOP, NO_SUCH], ["type [19] [Orchid Card Game Z9999] [1]"])) == \
        "stop [N/A]"


# -- the real shop ----------------------------------------------------------------------------------------------


def fast_shop() -> WebShopSuite:
    """The committed tasks on the default catalog; no screenshots or images (the reader reads text only)."""
    return WebShopSuite(screenshots=False, keep_rasters=False, load_images=False, time_scale=0.0)


class Blind(GroundedPolicy):
    """The grounded policy given a reference that fails the test if anything reads it, and, for sample 1 of the
    tasks ``corrupt`` names, observations passed through that task's function."""

    def __init__(self, corrupt: dict[str, Callable[[str], str]] | None = None, **kwargs: object):
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.corrupt = corrupt or {}

    def plan(self, ctx: PolicyContext):  # type: ignore[override]
        seen = ctx.observations
        if ctx.sample == 1 and ctx.task_id in self.corrupt:
            seen = [self.corrupt[ctx.task_id](o) for o in seen]
        return super().plan(replace(ctx, reference=Tripwire(), observations=seen))  # ``extra`` is shared


async def run_shop(policy: GroundedPolicy, state_dir: Path, task_ids: list[str] | None = None,
                   group_size: int = 1, seed: int = 0):
    engine = RolloutEngine(fast_shop(), policy, concurrency=4, state_dir=state_dir)
    async with engine:
        results = await engine.run(engine.requests(task_ids, group_size=group_size, seed=seed))
        templates = {t.id: t.template for t in engine.tasks.values()}
    await assert_no_leaks(engine.runtime)
    return [r.trajectory for r in results], templates


# One loop only: this measures the policy on the whole suite (~20 s), not the engine on two loops.
@pytest.mark.slow
@pytest.mark.asyncio(loop_factories=["uvloop"])
async def test_it_solves_most_feasible_tasks_of_every_template(state_dir, loop_watchdog) -> None:
    trajectories, templates = await run_shop(Blind(detour_p=0.0, time_scale=0), state_dir)
    per: dict[str, list[float]] = collections.defaultdict(list)
    for t in trajectories:
        assert t.status in ("ok", "max_steps"), (t.task_id, t.status, t.error)
        per[templates[t.task_id]].append(t.reward)
    print("\ngrounded web shop reader, detour_p=0, seed 0:")
    for name, rewards in per.items():
        print(f"  {name:22} {sum(r == 1 for r in rewards)}/{len(rewards)}"
              f"{'  (infeasible: the right answer is N/A)' if name in INFEASIBLE else ''}")
    feasible = [r for name, rs in per.items() if name not in INFEASIBLE for r in rs]
    infeasible = [r for name, rs in per.items() if name in INFEASIBLE for r in rs]
    solved = sum(r == 1 for r in feasible)
    print(f"  feasible: {solved}/{len(feasible)}; infeasible given up: {sum(r == 1 for r in infeasible)}/"
          f"{len(infeasible)}")
    assert len(trajectories) == 70 and len(feasible) == 63
    assert solved >= 0.6 * len(feasible)
    for name, rewards in per.items():  # no template is left behind
        assert sum(r == 1 for r in rewards) >= 0.6 * len(rewards), name


def _plus_one_review(text: str) -> str:
    return re.sub(r"link '(\d+) Reviews'", lambda m: f"link '{int(m.group(1)) + 1} Reviews'", text)


def _plus_one_dollar(text: str) -> str:
    return re.sub(r"\$(\d+)\.(\d\d)", lambda m: f"${int(m.group(1)) + 1}.{m.group(2)}", text)


CORRUPTIONS = {  # template: (what the sample that is lied to sees, the answer that follows from it)
    "review_count": (_plus_one_review, lambda clean: str(int(clean) + 1)),
    "cheapest_in_category": (_plus_one_dollar, _plus_one_dollar),
    "order_total": (_plus_one_dollar, _plus_one_dollar),
}


@pytest.mark.asyncio
async def test_a_corrupted_number_on_the_page_changes_the_answer_and_the_reward(state_dir, loop_watchdog) -> None:
    """One group of two samples per task: sample 0 sees the pages as they are, sample 1 sees the number it reads
    altered (a review count, every price). The answer follows what was seen, and the reward drops from 1 to 0."""
    tasks: dict[str, SuiteTask] = {}
    for t in fast_shop().tasks():
        if t.template in CORRUPTIONS:
            tasks.setdefault(t.template, t)  # the first task of each
    policy = Blind(corrupt={t.id: CORRUPTIONS[name][0] for name, t in tasks.items()}, detour_p=0.0, time_scale=0)
    trajectories, _ = await run_shop(policy, state_dir, [t.id for t in tasks.values()], group_size=2, seed=4)
    for name, task in tasks.items():
        clean, corrupted = sorted((t for t in trajectories if t.task_id == task.id), key=lambda t: t.sample)
        assert clean.final is not None and corrupted.final is not None
        answer, altered = clean.final.args["answer"], corrupted.final.args["answer"]
        print(f"\n{name} task {task.id}: clean answer {answer!r} (reward {clean.reward}), corrupted {altered!r} "
              f"(reward {corrupted.reward})")
        assert altered == CORRUPTIONS[name][1](answer) != answer
        assert (clean.reward, corrupted.reward) == (1.0, 0.0)

"""The grounded policy's core, on canned observations (no workspace): same seed same decisions, seeded detours the
readers cope with, the reference never read, the scripted policy's latency model, and suites it cannot read."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from bunshin.envs.records import ToolCall
from bunshin.policies.base import PolicyContext, PolicyError
from bunshin.policies.grounded import GroundedPolicy
from bunshin.policies.registry import make_policy
from bunshin.policies.scripted import DETOURS, ScriptedPolicy

HOME = """Tab 0 (current): Home Page

[1] RootWebArea 'Home Page' focused: True
\t[10] listitem ''
\t\t[11] link 'My Account'
\t[16] link 'One Stop Market'
\t[19] textbox 'Search entire store here...' required: False
\t[20] button 'Search'
\t[23] heading 'Home Page'
\t[29] link 'Coffee'"""
PRODUCT = "Orchid Card Game R812"
QUESTION = f"How many reviews does {PRODUCT} have?"


class Tripwire(list):
    """A reference that fails the test the moment anything looks at it."""

    def _touched(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("the grounded policy read the task's reference")

    __iter__ = __len__ = __getitem__ = __bool__ = __contains__ = __eq__ = __repr__ = _touched  # type: ignore


def context(seed: int = 7, *, instruction: str = QUESTION, reference: list[ToolCall] | None = None,
            suite: str = "webshop", sample: int = 0) -> PolicyContext:
    return PolicyContext(suite=suite, task_id="0", group_id="0:0", sample=sample, seed=seed, instruction=instruction,
                         reference=reference if reference is not None else [], observations=[HOME])


def actions(policy: GroundedPolicy, ctx: PolicyContext, steps: int) -> list[str]:
    """The policy's first ``steps`` actions when every action leaves the home page as it was."""
    out = []
    for _ in range(steps):
        action = policy.plan(ctx)
        assert isinstance(action, str)
        out.append(action)
        ctx.actions.append(action)
        ctx.observations.append(HOME)
        ctx.step += 1
    return out


def test_the_same_seed_gives_the_same_actions_and_other_seeds_other_detours() -> None:
    policy = GroundedPolicy(detour_p=0.5, time_scale=0)
    runs = {seed: actions(policy, context(seed), 30) for seed in range(6)}
    print("seeds 0-5, detour_p 0.5")
    assert runs == {seed: actions(policy, context(seed), 30) for seed in range(6)}
    assert len({tuple(r) for r in runs.values()}) > 1, "every seed made the same detours"
    for run in runs.values():
        assert set(run) <= {*DETOURS["webshop"], "type [19] [Orchid Card Game R812] [1]"}


def test_without_detours_the_reader_decides_every_step() -> None:
    policy = GroundedPolicy(detour_p=0.0, time_scale=0)
    assert actions(policy, context(), 5) == ["type [19] [Orchid Card Game R812] [1]"] * 5


def test_detours_come_from_the_scripted_list_and_the_reader_copes_after_one() -> None:
    policy = GroundedPolicy(detour_p=0.9, time_scale=0)
    ctx = context(3)
    run = actions(policy, ctx, 40)
    print("seed 3, detour_p 0.9:", run[:8])
    detours = [a for a in run if a in DETOURS["webshop"]]
    assert 25 <= len(detours) < 40
    after_detour = [run[i + 1] for i in range(len(run) - 1) if run[i] in DETOURS["webshop"]
                    and run[i + 1] not in DETOURS["webshop"]]
    assert after_detour and set(after_detour) == {"type [19] [Orchid Card Game R812] [1]"}


def test_the_reference_is_never_read() -> None:
    """Garbage, empty, or a reference that fails when touched: the same actions."""
    policy = GroundedPolicy(detour_p=0.3, time_scale=0)
    garbage = [ToolCall(name="stop", args={"answer": "42"}), ToolCall(name="click", args={"element_id": 99})]
    runs = [actions(policy, context(5, reference=ref), 12) for ref in ([], garbage, Tripwire())]
    assert runs[0] == runs[1] == runs[2]


def test_it_keeps_the_scripted_latency_model() -> None:
    ctx = context(11)
    grounded = GroundedPolicy(time_scale=0.5, median_tokens=100, sigma=0.3, tokens_per_s=50, sleep=False)
    scripted = ScriptedPolicy(time_scale=0.5, median_tokens=100, sigma=0.3, tokens_per_s=50, sleep=False)
    for step in range(5):
        at = replace(ctx, step=step)
        assert grounded.reasoning_time(at) == scripted.reasoning_time(at) > 0
    decision = asyncio.run(grounded.decide(ctx))
    assert decision.reasoning_s == scripted.reasoning_time(ctx)


def test_an_unknown_suite_is_a_policy_error_naming_it() -> None:
    with pytest.raises(PolicyError, match="'spreadsheet-arena'"):
        GroundedPolicy(detour_p=0.0).plan(context(suite="spreadsheet-arena"))


def test_arguments_are_checked_and_the_registry_makes_it() -> None:
    with pytest.raises(ValueError):
        GroundedPolicy(detour_p=1.0)
    with pytest.raises(ValueError):
        GroundedPolicy(time_scale=-1)
    policy = make_policy("grounded", 0.25)
    assert isinstance(policy, GroundedPolicy) and policy.name == "grounded"
    assert policy.time_scale == 0.25 and policy.detour_p == 0.15
    with pytest.raises(ValueError, match="grounded"):
        make_policy("no-such-policy", 1.0)

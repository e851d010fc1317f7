"""BrowserGym's own environments on the embedded web shop's tasks: a scripted BrowserGym agent (BrowserGym's action
strings, bids read from its accessibility tree) in BrowserGym's Chromium, the shop in a fork reached through a port
carried into that fork only. Rewards equal the suite's reference run's; a wrong answer scores 0; each reset is a
fresh fork; two environments of one task do not see each other's shop; close leaves nothing behind."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bunshin.engine.commands.suite_check import attempt
from bunshin.envs import Limits, WorkspaceRuntime
from bunshin.envs.suites.base import SuiteTask

from .adapter_helpers import assert_no_leaks_sync

pytest.importorskip("browsergym.core", reason="the browsergym extra (./scripts/setup.sh --browsergym)")
import gymnasium  # noqa: E402  (after the skip: browsergym brings it)

from bunshin.engine.adapters import browsergym as bg  # noqa: E402

# a task of each evaluator: string_match, program_html on the agent's cart (its cookie), url_match, infeasible
TASKS = {"7": "product_attribute", "45": "add_to_cart", "41": "category_sorted", "69": "unachievable"}
# the other templates: checkout (an order), review_count, search_for, write_review (a review through REST),
# cheapest_in_category, order_total (the latest order's page)
MORE = {"54": "checkout", "3": "review_count", "33": "search_for", "56": "write_review", "17": "cheapest_in_category",
        "23": "order_total"}
FAST = {"slow_mo": 0, "pre_observation_delay": 0}  # BrowserGym's defaults wait 1.5 s a step; nothing here needs it
_TARGET = re.compile(r"^(\w+) \[@(\w+) '((?:[^'\\]|\\.)*)'\](.*)$")


@pytest.fixture(scope="module", autouse=True)
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield bg.debian_chromium(tmp_path_factory.mktemp("playwright"))
    # BrowserGym keeps one Playwright for the process, whose sync API leaves an event loop marked running on this
    # thread: every later asyncio test would find it ("cannot be called from a running event loop"). Stopped here.
    import browsergym.core

    playwright = browsergym.core._PLAYWRIGHT
    if playwright is not None:
        playwright.stop()
        browsergym.core._set_global_playwright(None)


def task_kwargs(state_dir: Path) -> dict[str, Any]:
    return {"state_dir": str(state_dir), "limits": {"memory_bytes": 2 << 30, "pids": 256, "command_timeout_s": 30}}


def bid_of(obs: dict[str, Any], role: str, name: str) -> str:
    """The bid BrowserGym gave the first element of this role and accessible name on the page it observed."""
    for node in obs["axtree_object"]["nodes"]:
        if (node.get("role", {}).get("value") == role and node.get("name", {}).get("value") == name
                and "browsergym_id" in node):
            return str(node["browsergym_id"])
    raise LookupError(f"no {role} {name!r} on {obs['url']}")


def browsergym_actions(step: str, obs: dict[str, Any]) -> list[str]:
    """A reference step of the task file (WebArena's language, elements by role and name) as the BrowserGym actions
    an agent would write for it on the page it sees."""
    if step.startswith("stop"):
        match = re.fullmatch(r"stop \[(.*)\]", step)
        assert match, step
        answer = match.group(1)
        return [f"report_infeasible({answer!r})" if answer == "N/A" else f"send_msg_to_user({answer!r})"]
    match = _TARGET.match(step)
    assert match, step
    verb, role, name, rest = match.groups()
    bid = bid_of(obs, role, name)
    if verb == "click":
        return [f"click({bid!r})"]
    assert verb == "type", step
    text, *flags = re.findall(r"\[([^\]]*)\]", rest)
    return [f"fill({bid!r}, {text!r})"] + ([f"press({bid!r}, 'Enter')"] if flags and flags[0] == "1" else [])


def reference_steps(task: SuiteTask) -> list[str]:
    return list(json.loads(Path(task.path).read_text())["bunshin_reference"])


def reference_score(task: SuiteTask, state_dir: Path) -> float:
    """The suite's own reference run of ``task`` (its text browser in a workspace), as ``bunshin suite check``
    plays it."""
    suite = bg.SUITES["webshop"]

    async def run() -> float:
        async with WorkspaceRuntime(state_dir=state_dir, limits=Limits(memory_bytes=2 << 30, pids=256,
                                                                        command_timeout_s=30)) as rt:
            base = await rt.create(suite.app(task))
            try:
                score, why, broke = await attempt(suite, base, task, task.reference)
            finally:
                await base.close()
        assert not broke, why
        return score

    # on a thread of its own: BrowserGym's Playwright keeps an event loop running on this one
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run()).result()


def play(env: Any, steps: list[str], seed: int) -> tuple[float, bool, dict[str, Any]]:
    obs, info = env.reset(seed=seed)
    reward, terminated = 0.0, False
    for step in steps:
        for action in browsergym_actions(step, obs):
            assert not terminated, f"the episode ended before {action}"
            obs, reward, terminated, truncated, info = env.step(action)
            error = obs["last_action_error"]
            # BrowserGym's actions wait 500 ms for the navigation they start; on a loaded machine a click that was
            # done can time out there (BrowserGym's own limit), the page loading on: that is not the agent's error
            assert not error or ("action done" in error and "waiting for scheduled navigations" in error), \
                (action, error)
            assert not truncated
    return float(reward), terminated, obs


def run_template(task_id: str, state_dir: Path) -> None:
    task = next(t for t in bg.SUITES["webshop"].tasks() if t.id == task_id)
    expected = reference_score(task, state_dir)
    assert expected == 1.0
    env = gymnasium.make(f"browsergym/bunshin.webshop.{task_id}", task_kwargs=task_kwargs(state_dir), **FAST)
    try:
        reward, terminated, obs = play(env, reference_steps(task), seed=1)
        assert (reward, terminated) == (expected, True), obs["chat_messages"]
        assert obs["url"].startswith(env.unwrapped.task.base_url)
        rt = env.unwrapped.task.session.runtime
    finally:
        env.close()
    assert_no_leaks_sync(rt)


@pytest.mark.parametrize("task_id", TASKS, ids=TASKS.values())
def test_a_browsergym_agent_scores_as_the_reference_run(task_id: str, state_dir: Path) -> None:
    run_template(task_id, state_dir)


@pytest.mark.full
@pytest.mark.parametrize("task_id", MORE, ids=MORE.values())
def test_a_browsergym_agent_scores_as_the_reference_run_on_every_template(task_id: str, state_dir: Path) -> None:
    run_template(task_id, state_dir)


def test_a_wrong_answer_or_an_undone_task_scores_0_and_each_reset_is_a_fresh_fork(state_dir: Path) -> None:
    suite = bg.SUITES["webshop"]
    attribute = next(t for t in suite.tasks() if t.id == "7")
    env = gymnasium.make("browsergym/bunshin.webshop.7", task_kwargs=task_kwargs(state_dir), **FAST)
    try:
        steps = reference_steps(attribute)
        reward, terminated, obs = play(env, [*steps[:-1], "stop [Black]"], seed=1)
        assert (reward, terminated) == (0.0, True)
        # a step without a message to the user neither scores nor ends the episode
        obs, _ = env.reset(seed=2)
        obs, reward, terminated, truncated, _ = env.step(browsergym_actions(steps[0], obs)[0])
        assert (reward, terminated, truncated) == (0.0, False, False)
    finally:
        env.close()

    cart = next(t for t in suite.tasks() if t.id == "45")
    env = gymnasium.make("browsergym/bunshin.webshop.45", task_kwargs=task_kwargs(state_dir), **FAST)
    try:
        steps = reference_steps(cart)
        reward, terminated, _ = play(env, steps, seed=1)
        assert (reward, terminated) == (1.0, True)
        session = env.unwrapped.task.session
        # the next reset is a new fork of the set-up shop: the cart above is not in it, saying done scores 0
        reward, terminated, _ = play(env, steps[-1:], seed=2)
        assert (reward, terminated) == (0.0, True)
        assert env.unwrapped.task.session is session  # the env held it: the reset forked, it did not set up again
        rt = env.unwrapped.task.session.runtime
    finally:
        env.close()
    assert_no_leaks_sync(rt)


def test_two_envs_of_one_task_reach_their_own_fork_only_and_close_leaves_nothing(state_dir: Path) -> None:
    cart = next(t for t in bg.SUITES["webshop"].tasks() if t.id == "45")
    steps = reference_steps(cart)
    one = gymnasium.make("browsergym/bunshin.webshop.45", task_kwargs=task_kwargs(state_dir), **FAST)
    two = gymnasium.make("browsergym/bunshin.webshop.45", task_kwargs=task_kwargs(state_dir), **FAST)
    try:
        play(one, steps[:-1], seed=1)  # the item in one's cart, no answer yet
        two.reset(seed=1)
        first, second = one.unwrapped.task, two.unwrapped.task
        assert first.session is second.session  # one set-up workspace, two forks
        assert first.base_url != second.base_url
        # both forks draw the same session id (the same seed), yet two's cart is its own: empty, so done scores 0
        _, reward, terminated, _, _ = two.step("send_msg_to_user('done')")
        assert (reward, terminated) == (0.0, True)
        _, reward, terminated, _, _ = one.step("send_msg_to_user('done')")
        assert (reward, terminated) == (1.0, True)
        rt, port = first.session.runtime, int(first.base_url.rsplit(":", 1)[1])
    finally:
        one.close()
        two.close()
    with pytest.raises(ConnectionRefusedError):  # the port into the fork is gone with it
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    assert_no_leaks_sync(rt)


def test_an_unknown_suite_is_refused_by_name() -> None:
    with pytest.raises(bg.AdapterError, match="no web suite 'nosuch'"):
        bg.ShopTask(seed=0, suite="nosuch", task_id="7")

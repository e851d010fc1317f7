"""Tool latency that belongs to the environment (``envs/latency.py``), in real workspaces of both suites: an agent
call's ``tool_seconds`` includes its modelled delay, scaled by the suite's ``time_scale``; the delays are a function
of the calls alone (two samples with different seeds that issue the same calls see the same delays, and a clone on
either fork backend goes on with its source's chain); ``time_scale=0`` adds nothing; internal tools neither wait nor
change later delays; a bad ``time_scale`` is a ValueError naming the knob; and the CLI's ``--time-scale`` reaches
the suite's knob (``bench sharing`` stays at 0)."""

from __future__ import annotations

import math
import statistics

import pytest

from bunshin.envs import ToolCall, Workspace
from bunshin.envs.desktop.app import DesktopApp
from bunshin.envs.desktop.suite import DesktopSuite
from bunshin.envs.latency import DESKTOP, WEBSHOP, Delay, ToolLatency
from bunshin.envs.webshop.app import ShopApp
from bunshin.envs.webshop.suite import WebShopSuite

SCALE = 0.05
DESK = {"cache_mb": 8, "index_roots": ["/usr/lib/python3.11/json"], "recording_frames": 2}
SHOP_URL = "http://127.0.0.1:7770"


def C(name: str, **args: object) -> ToolCall:
    return ToolCall(name=name, args=args)


# (call, the latency kind it has): the first two run in the source, the rest after the fork
SHOP_CALLS = [(C("goto", url=SHOP_URL + "/"), "page"), (C("scroll", direction="down"), "in_page"),
              (C("goto", url=SHOP_URL + "/catalogsearch/result/?q=shirt"), "page"),
              (C("scroll", direction="up"), "in_page"), (C("go_back"), "in_page")]
DESK_CALLS = [(C("editor_open", path="Documents/meeting_notes.txt"), "action"),
              (C("terminal", command="echo hi"), "command"),
              (C("editor_insert", line=1, text="latency"), "action"), (C("WAIT", seconds=0.01), "wait"),
              (C("sheet_open", path="Documents/budget.csv"), "action")]
INTERNAL = {"webshop": [C("_url"), C("_page_text", selector="title")], "desktop": [C("_screen"), C("_terminal_output")]}


def expected_delays(profile: str, calls: list[tuple[ToolCall, str]], scale: float) -> list[float]:
    """The delays the model gives these calls from a fresh workspace, computed outside any workspace."""
    model = ToolLatency(profile, scale)
    return [model.delay(model.begin(call.name, call.args), kind) for call, kind in calls]


async def run(ws: Workspace, calls: list[tuple[ToolCall, str]], internal: list[ToolCall] = ()) -> list[float]:
    """Each call's modelled delay (read back from the workspace's latency state), checking that its
    ``tool_seconds`` covers it; ``internal`` tools run between the calls."""
    delays = []
    for call, _ in calls:
        obs = await ws.execute(call)
        assert obs.error is None, (call, obs.error)
        state = (await ws.execute(C("_latency"))).data
        assert obs.tool_seconds >= state["last_s"]
        delays.append(state["last_s"])
        for other in internal:
            assert (await ws.execute(other)).error is None
            assert (await ws.execute(C("_latency"))).data == state  # no wait, no change to the chain
    return delays


# -- the model --------------------------------------------------------------------------------------------------------


def test_delays_are_a_function_of_the_calls_and_scale_exactly() -> None:
    calls = [c for c, _ in SHOP_CALLS]
    one, again, tenth = ToolLatency("webshop", 1.0), ToolLatency("webshop", 1.0), ToolLatency("webshop", 0.1)
    draws = [m.begin(c.name, c.args) for m in (one, again, tenth) for c in calls]
    assert draws[:5] == draws[5:10] == draws[10:]
    assert [tenth.delay(z, "page") for z in draws[:5]] == [one.delay(z, "page") * 0.1 for z in draws[:5]]
    # the order of the calls matters (a chain, not a bag), the spelling of the arguments does not
    swapped = ToolLatency("webshop")
    assert [swapped.begin(c.name, c.args) for c in reversed(calls)][-1] != draws[0]
    assert ToolLatency("webshop").begin("type", {"text": "a", "element_id": 1}) == \
        ToolLatency("webshop").begin("type", {"element_id": 1, "text": "a"})
    with pytest.raises(ValueError, match="internal tool"):
        ToolLatency("desktop").begin("_screen", {})


def test_the_draws_follow_the_documented_distributions() -> None:
    model = ToolLatency("webshop")
    fixed = WEBSHOP["page"].fixed_s  # WebArena's 2 s after every action, then the page's own lognormal time
    pages = sorted(model.delay(model.begin("click", {"element_id": i}), "page") - fixed for i in range(4000))
    assert abs(statistics.median(pages) / WEBSHOP["page"].median_s - 1) < 0.05
    logs = [math.log(p) for p in pages]
    assert abs(statistics.stdev(logs) - WEBSHOP["page"].sigma) < 0.03
    desk = ToolLatency("desktop")
    actions = [desk.delay(desk.begin("sheet_get", {"cell": f"A{i}"}), "action") for i in range(2000)]
    assert min(actions) > DESKTOP["action"].fixed_s  # OSWorld's pause is always paid
    assert desk.delay(desk.begin("terminal", {"command": "ls"}), "command") == 0.0
    assert Delay(fixed_s=0.5).seconds(3.0) == 0.5


@pytest.mark.parametrize("bad", [-0.5, float("nan"), float("inf"), "1", True, None])
def test_a_bad_time_scale_is_a_value_error_naming_the_knob(bad: object) -> None:
    for make in (lambda: WebShopSuite(time_scale=bad), lambda: DesktopSuite(time_scale=bad, **DESK),
                 lambda: ShopApp(time_scale=bad), lambda: DesktopApp(time_scale=bad, cache_mb=0)):
        with pytest.raises(ValueError, match="time_scale"):
            make()


def test_the_knob_is_part_of_the_workspace_configuration() -> None:
    assert WebShopSuite(catalog_size=200, time_scale=0.5).app().kwargs["time_scale"] == 0.5
    assert DesktopSuite(time_scale=2, **DESK).app().kwargs["time_scale"] == 2.0
    assert DesktopSuite(**DESK).app().kwargs["time_scale"] == 1.0  # by default: real seconds
    assert WebShopSuite(catalog_size=200).app().kwargs["time_scale"] == 1.0


# -- in workspaces ----------------------------------------------------------------------------------------------------


def make_suite(name: str, time_scale: float) -> WebShopSuite | DesktopSuite:
    if name == "webshop":
        return WebShopSuite(catalog_size=200, screenshots=False, time_scale=time_scale)
    return DesktopSuite(time_scale=time_scale, screenshots=False, **DESK)


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["cow", "restore"])
@pytest.mark.parametrize("name", ["webshop", "desktop"])
async def test_samples_and_clones_see_the_delays_their_calls_give(make_runtime, name: str, backend: str) -> None:
    """(a) tool_seconds covers the modelled, scaled delay; (b) two samples forked with different seeds that issue
    the same calls see the same delays, equal to the model's; (c) on this backend a clone's next call gets the
    delay its source's same next call gets; (e) internal tools in one of them change nothing."""
    rt = await make_runtime(backend=backend)
    calls = SHOP_CALLS if name == "webshop" else DESK_CALLS
    profile = WEBSHOP if name == "webshop" else DESKTOP
    want = expected_delays(name, calls, SCALE)
    assert all(d > 0 for (_, kind), d in zip(calls, want, strict=True) if profile[kind] != Delay())
    base = await rt.create(make_suite(name, SCALE).app())
    assert await run(base, calls[:2]) == want[:2]
    one, two = await base.fork(seed=1), await base.fork(seed=2)
    assert one.seed != two.seed
    assert await run(one, calls[2:], INTERNAL[name]) == want[2:]
    assert await run(two, calls[2:]) == want[2:]
    assert await run(base, calls[2:]) == want[2:]
    states = [(await ws.execute(C("_latency"))).data for ws in (base, one, two)]
    assert states[0] == states[1] == states[2] and states[0]["calls"] == len(calls)


@pytest.mark.asyncio
async def test_a_page_load_waits_its_delay_and_time_scale_0_adds_nothing(make_runtime) -> None:
    """(a) with a larger scale the wait dominates a page load's tool_seconds; (d) at 0 nothing is added, while the
    chain still advances (a later scale change would not shift the draws)."""
    rt = await make_runtime()
    slow = await rt.create(make_suite("webshop", 0.4).app())
    off = await rt.create(make_suite("webshop", 0.0).app())
    page = SHOP_CALLS[0][0]
    [delay] = expected_delays("webshop", SHOP_CALLS[:1], 0.4)
    got = await slow.execute(page)
    assert got.error is None and delay <= got.tool_seconds < delay + 5.0
    quick = await off.execute(page)
    state = (await off.execute(C("_latency"))).data
    assert quick.error is None and state["last_s"] == 0.0 and state["calls"] == 1 and state["time_scale"] == 0.0
    assert state["chain"] == (await slow.execute(C("_latency"))).data["chain"]
    assert quick.tool_seconds < got.tool_seconds


# -- the command line -------------------------------------------------------------------------------------------------


def test_the_cli_time_scale_reaches_the_suite_knob(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """``eval --time-scale X`` and ``bench memory --time-scale X`` scale the suite's tool latency too, unless
    ``--set time_scale=Y`` says otherwise; ``bench sharing`` runs without latency."""
    from bunshin.engine import cli
    from bunshin.engine.bench import memory, sharing
    from bunshin.engine.commands import eval_command

    seen: list[float] = []

    async def fake(suite, *args, **kwargs):
        seen.append(suite.app().kwargs["time_scale"])
        return {"rollouts": 1}

    monkeypatch.setattr(eval_command, "run_eval", fake)
    monkeypatch.setattr(memory, "main", fake)
    monkeypatch.setattr(sharing, "main", fake)
    common = ["--suite", "desktop", "--set", "cache_mb=8"]
    cli.main(["eval", *common, "--time-scale", "0.25", "--out", str(tmp_path)])
    cli.main(["eval", *common, "--time-scale", "0.25", "--set", "time_scale=2", "--out", str(tmp_path)])
    cli.main(["eval", *common, "--out", str(tmp_path)])
    cli.main(["bench", "memory", *common, "--time-scale", "0.5"])
    cli.main(["bench", "sharing", *common])
    assert seen == [0.25, 2.0, 0.05, 0.5, 0.0]
    with pytest.raises(SystemExit, match="time_scale"):
        cli.main(["eval", *common, "--set", "time_scale=-1", "--out", str(tmp_path)])

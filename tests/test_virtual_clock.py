"""The workspace's virtual clock: the hook in a real interpreter (what it replaces, what it leaves real, the
sitecustomize it shadows), and the desktop's equal calls answering alike under it, in real workspaces."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bunshin.envs import ToolCall, clock_hook
from bunshin.envs.desktop.suite import DesktopSuite
from bunshin.envs.virtual_clock import CALL_NS, START_NS, VirtualClock

SMALL = {"cache_mb": 8, "index_roots": ["/usr/lib/python3.11/json"], "recording_frames": 2, "time_scale": 0.0,
         "screenshots": False}
PROBE = textwrap.dedent("""
    import threading, time
    t0, t1 = time.time_ns(), time.time_ns()
    p0 = time.perf_counter(); p1 = time.perf_counter()
    m0 = time.monotonic(); time.sleep(0.2); m1 = time.monotonic()
    after_sleep = time.time_ns()
    waited = threading.Event().wait(0.05)  # a timed wait still times out in real time
    print(t0, t1 - t0, round((p1 - p0) * 1e9), round((m1 - m0) * 1e3), after_sleep - t1, waited,
          time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), time.localtime().tm_year)
""")


def hook_dir(tmp_path: Path) -> Path:
    d = tmp_path / "hook"
    d.mkdir()
    (d / "sitecustomize.py").write_text(Path(clock_hook.__file__).read_text())
    return d


def run_probe(tmp_path: Path, env: dict[str, str], *flags: str) -> list[str]:
    out = subprocess.run([sys.executable, *flags, "-c", PROBE], env={"PATH": os.environ["PATH"], **env},
                         capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.split()


def test_a_program_reads_the_clock_from_its_start_a_microsecond_per_read_and_sleeps_really(tmp_path: Path) -> None:
    start = START_NS + 3 * CALL_NS
    t0, dt, dp, slept_ms, after_sleep, waited, day, clock, year = run_probe(
        tmp_path, {"PYTHONPATH": str(hook_dir(tmp_path)), clock_hook.ENV: str(start)})
    assert int(t0) == start and int(dt) == clock_hook.TICK_NS and int(dp) == clock_hook.TICK_NS
    assert int(slept_ms) >= 190  # monotonic is real, and so is the sleep
    assert int(after_sleep) == 200_000_000 + 3 * clock_hook.TICK_NS  # the sleep moved the clock by what it slept
    assert waited == "False"
    assert (day, clock, year) == ("2023-11-14", "22:13:23", "2023")  # gmtime() without an argument: the clock's


def test_without_the_reading_or_isolated_a_program_keeps_the_real_clock(tmp_path: Path) -> None:
    import time
    hook = str(hook_dir(tmp_path))
    for env, flags in (({"PYTHONPATH": hook}, ()), ({"PYTHONPATH": hook, clock_hook.ENV: str(START_NS)}, ("-I",))):
        t0 = run_probe(tmp_path, env, *flags)[0]
        assert abs(int(t0) - time.time_ns()) < 60 * 10**9


def test_the_sitecustomize_it_shadows_still_runs(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import builtins\nbuiltins.SHADOWED_RAN = True\n")
    out = subprocess.run([sys.executable, "-c", "import time; print(SHADOWED_RAN, time.time_ns())"],
                         env={"PATH": os.environ["PATH"], "PYTHONPATH": f"{hook_dir(tmp_path)}:{other}",
                              clock_hook.ENV: str(START_NS)}, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["True", str(START_NS)]


def test_the_clock_moves_a_second_per_call_and_by_what_a_wait_waited() -> None:
    clock = VirtualClock()
    assert clock.reading_ns() == START_NS
    clock.step()
    clock.wait(2.5)
    clock.step()
    assert clock.reading_ns() == START_NS + 2 * CALL_NS + 2_500_000_000
    assert f"export {clock_hook.ENV}={clock.reading_ns()}\n" in clock.prelude()


def C(name: str, **args: object) -> ToolCall:
    return ToolCall(name=name, args=args)


TESTS = C("terminal", command="cd ~/project && python3 -m unittest 2>&1 | tail -n 3")
NOW = C("terminal", command="python3 -c 'import time; print(time.time_ns())'")


@pytest.mark.asyncio
async def test_equal_desktop_calls_answer_alike_under_the_virtual_clock(runtime) -> None:
    """The project's test run (1.5 s of real work, printing its duration) answers alike in two workspaces, a fresh
    one and a fork of a third, and so does a program printing the time after equal calls; the real clock does not."""
    suite = DesktopSuite(**SMALL)
    task = next(t for t in suite.tasks() if t.template == "project_tests")
    one = await runtime.create(suite.app(task))
    await suite.start(one, task)
    source = await runtime.create(suite.app(task))
    await suite.start(source, task)
    await source.execute(C("terminal", command="echo before the fork"))
    two = await source.fork()
    answers = []
    for ws, calls in ((one, [C("terminal", command="echo before the fork"), TESTS, NOW]), (two, [TESTS, NOW])):
        answers.append([(await ws.execute(call)).output for call in calls][-2:])
    assert answers[0] == answers[1]
    tests, now = answers[0]
    assert "Ran 6 tests in 0.000s" in tests  # (the task's bug is not fixed: one fails, in both)
    assert int(now) == START_NS + 2 * CALL_NS  # two calls served before it
    assert (await source.execute(NOW)).output.strip() == str(START_NS + CALL_NS)  # the source: one call before

    real = DesktopSuite(**SMALL, virtual_clock=False)
    ws = await runtime.create(real.app(task))
    await real.start(ws, task)
    run = (await ws.execute(TESTS)).output
    assert "Ran 6 tests in " in run and "Ran 6 tests in 0.000s" not in run
    assert abs(int((await ws.execute(NOW)).output) - __import__("time").time_ns()) < 600 * 10**9

"""The loop watchdog is on for every async test: a test that blocks the event loop (sleeping in a call or computing)
fails, naming where; one that does not passes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

PROBE = '''
import asyncio, os, subprocess, sys, time
import pytest

@pytest.mark.asyncio
async def test_blocks_the_loop():
    time.sleep(1.5)

@pytest.mark.asyncio
async def test_spins_the_loop():  # 1.5 s of the CPU, however long a loaded machine takes to give it
    end = time.thread_time() + 1.5
    while time.thread_time() < end:
        pass

@pytest.mark.asyncio
async def test_awaits():
    await asyncio.sleep(0.2)

# It ends by itself after 3 s: against it at nice 19 each ms of CPU the test uses costs seconds of waiting (the
# scheduler repays a low-weight task's lag slowly), so the test's end would otherwise wait on the scheduler.
HOG = ("import os, sys, time; os.sched_setaffinity(0, {int(sys.argv[1])}); os.nice(-20)\\n"
       "end = time.monotonic() + 3\\nwhile time.monotonic() < end: pass")

@pytest.mark.asyncio
async def test_starved_of_cpu():  # waiting 3 s for a CPU (a hog at nice -20 on the loop's one CPU) is not blocking
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})
    hog = subprocess.Popen([sys.executable, "-c", HOG, str(min(cpus))])
    os.nice(19)
    waited = lambda: int(open("/proc/thread-self/schedstat").read().split()[1]) / 1e9  # runnable, no CPU
    try:
        before, end = waited(), time.monotonic() + 2
        while time.monotonic() < end:
            await asyncio.sleep(0.05)
        assert waited() - before > 1, "the loop was not starved: the probe tests nothing"
    finally:
        hog.kill()
        hog.wait()
        os.nice(-19)
        os.sched_setaffinity(0, cpus)

def test_sync_tests_are_left_alone():
    time.sleep(1.2)

@pytest.mark.asyncio
async def test_holds_the_gil():  # a C call that keeps the GIL: no Python thread could look at the loop's stack
    import ctypes
    ctypes.PyDLL(None).usleep(1500000)
'''


def test_an_async_test_that_blocks_the_loop_fails_on_both_loops(tmp_path: Path) -> None:
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_probe.py").write_text(PROBE)
    shutil.copy(Path(__file__).parent.parent / "pyproject.toml", tmp_path / "pyproject.toml")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rE", str(tmp_path)],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    report = out.stdout + out.stderr
    assert "11 passed, 6 errors" in report, report  # the blocking tests ran, then failed at teardown
    assert report.count("the event loop was blocked") >= 6, report
    for test in ("test_blocks_the_loop", "test_spins_the_loop", "test_holds_the_gil"):  # sleeping, running, in C
        assert f"{test}[asyncio]" in report and f"{test}[uvloop]" in report, report
    assert "ERROR test_probe.py::test_starved_of_cpu" not in report, report
    # it names where, faulthandler's way (File "...", line N in function), a call holding the GIL too
    assert report.count('test_probe.py", line 7 in test_blocks_the_loop') >= 2, report
    assert report.count('test_probe.py", line 48 in test_holds_the_gil') >= 2, report

"""The loop watchdog is on for every async test: a test that blocks the event loop fails, one that does not passes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

PROBE = '''
import asyncio, time
import pytest

@pytest.mark.asyncio
async def test_blocks_the_loop():
    time.sleep(1.5)

@pytest.mark.asyncio
async def test_awaits():
    await asyncio.sleep(0.2)

def test_sync_tests_are_left_alone():
    time.sleep(1.2)
'''


def test_an_async_test_that_blocks_the_loop_fails_on_both_loops(tmp_path: Path) -> None:
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_probe.py").write_text(PROBE)
    shutil.copy(Path(__file__).parent.parent / "pyproject.toml", tmp_path / "pyproject.toml")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rE", str(tmp_path)],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    report = out.stdout + out.stderr
    assert "5 passed, 2 errors" in report, report  # the blocking tests ran, then failed at teardown
    assert report.count("the event loop was blocked") >= 2, report
    assert "test_blocks_the_loop[asyncio]" in report and "test_blocks_the_loop[uvloop]" in report

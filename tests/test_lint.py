"""The linters, as CI runs them: ``ruff check .`` (rules F, I, B, UP, SIM) and ``mypy`` (engine/ and envs/runtime/,
as ``[tool.mypy]`` in pyproject.toml configures it) from the repository root, both clean. Both tools are pinned in
the ``test`` extra, so a missing one fails here like any other finding.

mypy keeps its incremental cache in the temporary directory (one per checkout): the first run reads the packages
and the libraries they import (about a minute of CPU), later ones only what changed (a few seconds).
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MYPY_PATH = ".ci/mypy_path/bunshin/"  # how mypy names the files it finds through pyproject's mypy_path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=280)


def test_ruff_finds_nothing() -> None:
    done = run("ruff", "check", "--no-cache", ".")
    if done.returncode:
        pytest.fail(f"ruff check . found:\n{done.stdout}{done.stderr}", pytrace=False)


def test_mypy_finds_nothing() -> None:
    cache = Path(tempfile.gettempdir()) / f"bunshin-mypy-{hashlib.sha256(bytes(REPO)).hexdigest()[:12]}"
    done = run("mypy", "--cache-dir", str(cache))
    found = (done.stdout + done.stderr).replace(MYPY_PATH, "")
    if done.returncode:
        pytest.fail(f"mypy (as pyproject.toml's [tool.mypy] configures it) found:\n{found}", pytrace=False)
    checked = re.search(r"Success: no issues found in (\d+) source files", done.stdout)
    assert checked, found
    # it read the packages (not an empty set, as a mypy_path that no longer leads to them would give)
    ours = [p for root in ("engine", "envs/runtime") for p in (REPO / root).rglob("*.py")]
    assert int(checked[1]) >= len(ours), found

"""A workspace's virtual clock, as an embedded app keeps it for the programs it runs as the agent (the desktop's
terminal runs the project's tests, which print how long they took).

Owns: the reading (``VirtualClock``: a fixed start, one second more for every agent call the workspace served, plus
the seconds a call was told to wait; the app keeps it in its state, so a fork carries it and equal call sequences
read equal times); the shell prelude that hands it to a command (``BUNSHIN_CLOCK`` and a ``PYTHONPATH`` that finds
the hook); installing the hook (``clock_hook.py``) in the workspace as ``sitecustomize``. What a Python program
then reads is ``clock_hook.py``'s: the reading, one microsecond more per read, plus what it slept.
Leaves alone, and says so: programs not in Python, Python run with ``-I``/``-E``/``-S`` (the graders' isolated
runs), ``time.monotonic``, ``datetime.now()`` and the kernel's file timestamps. Real applications (a browser, a
real desktop) keep their clocks; their suites declare the calls that show them nondeterministic.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from . import clock_hook

HOOK_DIR = "/opt/bunshin/clock"  # in the workspace: root's, readable by the agent
START_NS = 1_700_000_000 * 10**9  # 2023-11-14 22:13:20 UTC: every workspace's clock starts here
CALL_NS = 10**9  # what one agent call moves the clock


class VirtualClock:
    def __init__(self) -> None:
        self.elapsed_ns = 0

    def reading_ns(self) -> int:
        return START_NS + self.elapsed_ns

    def step(self) -> None:
        """An agent call was served."""
        self.elapsed_ns += CALL_NS

    def wait(self, seconds: float) -> None:
        """A call waited ``seconds`` (the desktop's WAIT)."""
        self.elapsed_ns += max(0, round(seconds * 1e9))

    def prelude(self) -> str:
        """Shell lines that give the commands after them the clock."""
        return (f"export {clock_hook.ENV}={self.reading_ns()}\n"
                f"export PYTHONPATH={shlex.quote(HOOK_DIR)}${{PYTHONPATH:+:$PYTHONPATH}}\n")

    @staticmethod
    def install() -> None:
        """Put the hook in the workspace (run by the app's ``setup``, as root, in the workspace's root)."""
        os.makedirs(HOOK_DIR, mode=0o755, exist_ok=True)
        path = Path(HOOK_DIR, "sitecustomize.py")
        path.write_text(Path(clock_hook.__file__).read_text(encoding="utf-8"), encoding="utf-8")
        path.chmod(0o644)

"""The virtual clock inside a Python program an embedded app runs for the agent (installed in the workspace as
``sitecustomize``, see ``virtual_clock.py``).

Owns: replacing, when ``BUNSHIN_CLOCK`` (nanoseconds since the epoch) is set, ``time.time``/``time_ns``,
``perf_counter``/``perf_counter_ns`` and the no-argument forms of ``localtime``/``gmtime``/``ctime``/``asctime``/
``strftime`` with one counter that starts at that reading and advances ``TICK_NS`` per read; ``time.sleep`` still
sleeps and advances the counter by what it slept. So a duration the program prints counts its own clock reads (and
sleeps), and two equal runs print equal durations. Then it runs the ``sitecustomize`` it shadows, if any.
Leaves alone: ``time.monotonic`` (event loops and timed waits must keep real time), ``process_time`` (CPU time, no
one prints it as the time), ``datetime.now()`` (C, reads the kernel's clock).
Must never: import anything of bunshin (it runs in the image's interpreter), or fail the program it is loaded in.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import sys
import time
from typing import Any

ENV = "BUNSHIN_CLOCK"
TICK_NS = 1_000  # one microsecond per read


class Counter:
    """The program's virtual time: ``start_ns`` plus what its reads and sleeps have added."""

    def __init__(self, start_ns: int):
        self.start_ns = start_ns
        self.elapsed_ns = 0
        self._lock = _thread.allocate_lock()

    def read_ns(self) -> int:
        """The time since the start, then one tick more for the next read."""
        with self._lock:
            now = self.elapsed_ns
            self.elapsed_ns += TICK_NS
        return now

    def add_ns(self, ns: int) -> None:
        with self._lock:
            self.elapsed_ns += max(0, ns)


def install(start_ns: int, module: Any = time) -> Counter:
    """Make ``module`` (the ``time`` module) read ``start_ns`` plus a counter. Returns the counter."""
    counter = Counter(start_ns)
    real = {name: getattr(module, name) for name in ("sleep", "localtime", "gmtime", "ctime", "asctime", "strftime")}

    def time_ns() -> int:
        return counter.start_ns + counter.read_ns()

    def now() -> float:
        return time_ns() / 1e9

    def sleep(seconds: float) -> None:
        real["sleep"](seconds)  # a ValueError for a negative time, as the real one
        counter.add_ns(round(seconds * 1e9))

    def at(secs: float | None) -> float:
        return now() if secs is None else secs

    module.time, module.time_ns = now, time_ns
    module.perf_counter = lambda: counter.read_ns() / 1e9
    module.perf_counter_ns = counter.read_ns
    module.sleep = sleep
    module.localtime = lambda secs=None: real["localtime"](at(secs))
    module.gmtime = lambda secs=None: real["gmtime"](at(secs))
    module.ctime = lambda secs=None: real["ctime"](at(secs))
    module.asctime = lambda t=None: real["asctime"](real["localtime"](now()) if t is None else t)
    module.strftime = lambda fmt, t=None: real["strftime"](fmt, real["localtime"](now()) if t is None else t)
    return counter


def _shadowed_sitecustomize() -> None:
    """Run the ``sitecustomize`` later on the path (the image's own), which this module hides by its name."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def main() -> None:
    value = os.environ.get(ENV, "")
    if value.isdigit():
        install(int(value))
    with contextlib.suppress(Exception):  # as site.py treats a failing sitecustomize: the program runs on
        _shadowed_sitecustomize()


if __name__ == "sitecustomize":
    main()

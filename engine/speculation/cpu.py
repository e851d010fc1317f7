"""Speculation's CPU rule: no new branch while the machine's cores are saturated.

Owns: ``CpuLoad``, the busy fraction of every core together (``/proc/stat``'s first line: the time not idle and not
waiting for I/O, over all the time), measured over the last interval of at least ``window_s`` and read again only
when asked after that: no task of its own, one small file read per window. ``allows()`` says whether a branch may
start now: always without a ``limit``; with one, only while the last interval's busy fraction was below it. Why:
a branch is a fork and a tool call that compete for the cores with the samples' own calls; on saturated cores it
slows the samples it was meant to hide work for (issue 28, measured on two cores).
Must never: read the file more than once a window, or block (a read of /proc/stat is a few microseconds).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

STAT = Path("/proc/stat")
IDLE_FIELDS = (3, 4)  # idle and iowait, after "cpu": user nice system idle iowait irq softirq steal ...


def read_cpu_times(path: Path = STAT) -> tuple[int, int]:
    """(busy, total) clock ticks of all the cores together since boot (guest time is inside user and nice)."""
    fields = [int(v) for v in path.read_text().split("\n", 1)[0].split()[1:9]]
    idle = sum(fields[i] for i in IDLE_FIELDS)
    total = sum(fields)
    return total - idle, total


class CpuLoad:
    def __init__(self, limit: float | None, window_s: float = 0.5,
                 read: Callable[[], tuple[int, int]] = read_cpu_times,
                 clock: Callable[[], float] = time.monotonic):
        """``limit``: the busy fraction (0 to 1) from which no branch starts (None: no rule)."""
        if limit is not None and not 0.0 < limit <= 1.0:
            raise ValueError(f"the CPU limit must be a fraction in (0, 1], got {limit}")
        self.limit, self.window_s, self._read, self._clock = limit, window_s, read, clock
        self._at = clock() - window_s  # the first ask measures the time since now
        self._times = read()
        self.busy = 0.0  # the last interval's busy fraction
        self.refused = 0  # times ``allows`` said no

    def sample(self) -> float:
        """The busy fraction over the last full window (measured again once a window has passed)."""
        now = self._clock()
        if now - self._at >= self.window_s:
            busy, total = self._read()
            if total > self._times[1]:
                self.busy = (busy - self._times[0]) / (total - self._times[1])
            self._at, self._times = now, (busy, total)
        return self.busy

    def allows(self) -> bool:
        if self.limit is None:
            return True
        if self.sample() < self.limit:
            return True
        self.refused += 1
        return False

"""The run's memory over time: a reading sampled on a timer, its peak and its integral (GiB*s).

Owns: ``MemoryMeter``. The reading and the clock are injected (the engine reads its run's cgroup charge: every
workspace, shared pages counted once), so the arithmetic is tested without a runtime.
Must never: block the event loop for long (a reading is one small file read) or outlive ``stop()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

GiB = 1 << 30


class MemoryMeter:
    def __init__(self, reading: Callable[[], int], interval_s: float, clock: Callable[[], float] = time.monotonic):
        self.reading, self.interval_s, self.clock = reading, interval_s, clock
        self.timeline: list[tuple[float, int]] = []  # (seconds since start, bytes)
        self.peak_bytes = 0
        self.gib_s = 0.0
        self._started = clock()
        self._task: asyncio.Task[None] | None = None

    def now(self) -> int:
        return self.reading()

    def sample(self) -> int:
        """Read now; the integral grows by the trapezoid since the last sample."""
        t, value = self.clock() - self._started, self.reading()
        if self.timeline:
            t0, v0 = self.timeline[-1]
            self.gib_s += (t - t0) * (v0 + value) / 2 / GiB
        self.timeline.append((t, value))
        self.peak_bytes = max(self.peak_bytes, value)
        return value

    async def _run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        self._started = self.clock()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self.sample()

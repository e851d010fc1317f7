"""The run's memory over time: a reading sampled on a timer, its peak and its integral (GiB*s), and optionally a
detailed reading beside it (both measures, page tables, the engine's and nursery's own).

Owns: ``MemoryMeter``. The reading and the clock are injected (the engine reads its run's cgroup charge: every
workspace, shared pages counted once), so the arithmetic is tested without a runtime. The detail reading
(``WorkspaceRuntime.memory_detail``: PSS summed over every process of the run plus tmpfs, page tables, engine,
nursery) reads every process's smaps, so it runs in a thread at its own, slower interval; its samples are kept as
a timeline with each field's peak. ``window(t0, t1)`` gives the peak and the integral of a part of the run (an
epoch of a benchmark), its ends interpolated on the timeline; ``elapsed()`` is the meter's clock for its bounds.
Its two readers are tasks of its own ``TaskScope``, from ``start()`` to ``stop()``.
Must never: block the event loop for long (the main reading is one small file read) or outlive ``stop()``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import msgspec

from bunshin.envs.runtime.task_scope import TaskScope

GiB = 1 << 30


class MemoryMeter:
    def __init__(self, reading: Callable[[], int], interval_s: float, clock: Callable[[], float] = time.monotonic,
                 detail: Callable[[], msgspec.Struct] | None = None, detail_interval_s: float = 1.0):
        self.reading, self.interval_s, self.clock = reading, interval_s, clock
        self.detail, self.detail_interval_s = detail, detail_interval_s
        self.timeline: list[tuple[float, int]] = []  # (seconds since start, bytes)
        self.details: list[tuple[float, dict[str, Any]]] = []  # (seconds since start, detail reading's fields)
        self.peak_bytes = 0
        self.gib_s = 0.0
        self._started = clock()
        self._readers: TaskScope | None = None  # from start() to stop()

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

    def add_detail(self, reading: msgspec.Struct) -> None:
        self.details.append((self.clock() - self._started, msgspec.structs.asdict(reading)))

    def detail_peaks(self) -> dict[str, int]:
        """Each detail field's largest value over the run (fields peak at different instants)."""
        peaks: dict[str, int] = {}
        for _, fields in self.details:
            for name, value in fields.items():
                peaks[name] = max(peaks.get(name, 0), value)
        return peaks

    def elapsed(self) -> float:
        """Seconds since the meter started, on its clock (the timeline's time axis)."""
        return self.clock() - self._started

    def window(self, t0: float, t1: float) -> tuple[int, float]:
        """(peak bytes, GiB*s) between ``t0`` and ``t1`` (seconds since start): the samples inside and the
        timeline interpolated at both ends (held flat beyond its first and last sample); (0, 0.0) when empty."""
        if not self.timeline or t1 < t0:
            return 0, 0.0

        def at(t: float) -> float:
            if t <= self.timeline[0][0]:
                return float(self.timeline[0][1])
            for (ta, va), (tb, vb) in pairwise(self.timeline):
                if ta <= t <= tb:
                    return va + (vb - va) * (t - ta) / (tb - ta) if tb > ta else float(vb)
            return float(self.timeline[-1][1])

        points = [(t0, at(t0)), *((t, float(v)) for t, v in self.timeline if t0 < t < t1), (t1, at(t1))]
        gib_s = sum((tb - ta) * (va + vb) / 2 for (ta, va), (tb, vb) in pairwise(points)) / GiB
        return round(max(v for _, v in points)), gib_s

    @property
    def wall_s(self) -> float:
        return self.timeline[-1][0] if self.timeline else 0.0

    @property
    def mean_bytes(self) -> float:
        """Mean memory over the run: the integral divided by the time it covers."""
        return self.gib_s * GiB / self.wall_s if self.wall_s > 0 else float(self.peak_bytes)

    async def _run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.interval_s)

    async def _run_detail(self, detail: Callable[[], msgspec.Struct]) -> None:
        while True:
            self.add_detail(await asyncio.to_thread(detail))
            await asyncio.sleep(self.detail_interval_s)

    def start(self) -> None:
        self._started = self.clock()
        self._readers = readers = TaskScope("memory-meter")
        readers.start_soon(self._run(), name="memory-meter")
        if self.detail is not None:
            readers.start_soon(self._run_detail(self.detail), name="memory-meter-detail")

    async def stop(self) -> None:
        readers, self._readers = self._readers, None
        if readers is not None:
            await readers.aclose()
            self.sample()
            if self.detail is not None:  # a last detailed reading: a run shorter than its interval has one too
                self.add_detail(await asyncio.to_thread(self.detail))

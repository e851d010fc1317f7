"""Presenting what the commands and benchmarks measured: percentiles, sizes, Markdown tables for people, JSON for
machines, PNG plots, and the progress line of a batch of rollouts.

Owns: formatting only; ``Progress`` alone reads the monotonic clock (the elapsed time it shows and how often it
prints). Shared by ``commands/``, ``bench/`` and ``cli.py``, which import it; it imports none of them.
Must never: compute a result (the commands and benchmarks do).
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .records import Status, Trajectory


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, ``q`` in [0, 100]."""
    if not values:
        return math.nan
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    """``columns`` are (key, header) pairs; floats get 2 decimals."""
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.2f}"
        return str(v)

    lines = ["| " + " | ".join(h for _, h in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(k, "")) for k, _ in columns) + " |" for r in rows]
    return "\n".join(lines)


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(data, indent=2) + "\n")


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


class Progress:
    """One status line, rewritten in place on a terminal and printed every few seconds otherwise."""

    def __init__(self, total: int, out: Any = sys.stderr):
        self.total, self.out = total, out
        self.done = self.ok = self.failed = 0
        self.started = time.monotonic()
        self.last_print = 0.0
        self.tty = getattr(out, "isatty", lambda: False)()

    def update(self, t: Trajectory, memory: int) -> None:
        self.done += 1
        self.ok += t.status == Status.OK
        self.failed += t.status != Status.OK
        now = time.monotonic()
        width = 30
        bar = "#" * (width * self.done // max(self.total, 1))
        line = (f"[{bar:<{width}}] {self.done}/{self.total} rollouts  ok {self.ok}  failed {self.failed}  "
                f"memory {human_bytes(memory)}  {now - self.started:.0f}s")
        if self.tty:
            print("\r" + line, end="" if self.done < self.total else "\n", file=self.out, flush=True)
        elif now - self.last_print > 5 or self.done == self.total:
            print(line, file=self.out, flush=True)
            self.last_print = now

"""Tail priority: which samples will finish last, so speculation serves them first.

Owns: ``TailPredictor``. A sample's remaining steps are predicted from the lengths of rollouts already finished:
those of its own task (a GRPO group's samples and earlier epochs' run the same task), else its template, else all,
else a prior; given that the sample has taken ``step`` calls, the prediction is the mean of ``L - step`` over the
finished lengths ``L > step`` (the conditional mean: a sample that has gone long is expected to go longer). The
priority is the predicted time to finish, remaining steps times the sample's own mean step time so far (reasoning
plus tool; the batch's mean before its first step): the larger, the later the sample is expected to end.
How well it ranks is measured, not assumed: every prediction is kept with its sample and settled when the sample
ends (actual remaining = its final length less the step); ``rho()`` is Spearman's rank correlation of predicted
against actual remaining steps over every settled prediction.
Must never: do I/O; grow without bound (at most ``keep`` lengths per key and settled pairs).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Hashable, Sequence

PRIOR_STEPS = 8.0  # before any rollout has finished: a web-shop or desktop task takes about this many calls


class TailPredictor:
    def __init__(self, prior_steps: float = PRIOR_STEPS, keep: int = 4096):
        self.prior_steps, self.keep = prior_steps, keep
        self.lengths: dict[tuple[str, str], collections.deque[int]] = {}
        self.pending: dict[Hashable, list[tuple[int, float]]] = {}  # sample -> [(step, predicted remaining)]
        self.settled: collections.deque[tuple[float, int]] = collections.deque(maxlen=keep)
        self.step_s: collections.deque[float] = collections.deque(maxlen=256)

    def finished(self, sample: Hashable, task_id: str, template: str, length: int) -> None:
        """A rollout ended after ``length`` calls: learn its length, settle the predictions made for it."""
        for key in (("task", task_id), ("template", template), ("all", "")):
            self.lengths.setdefault(key, collections.deque(maxlen=self.keep)).append(length)
        for step, predicted in self.pending.pop(sample, []):
            self.settled.append((predicted, max(0, length - step)))

    def forget(self, sample: Hashable) -> None:
        """A rollout that ended without a length worth learning (it failed): drop its predictions."""
        self.pending.pop(sample, None)

    def remaining(self, task_id: str, template: str, step: int) -> float:
        """Predicted calls still to come for a sample of ``task_id`` that has taken ``step``."""
        for key in (("task", task_id), ("template", template), ("all", "")):
            longer = [n - step for n in self.lengths.get(key, ()) if n > step]
            if len(longer) >= 2:
                return sum(longer) / len(longer)
        return max(self.prior_steps - step, 1.0)

    def priority(self, sample: Hashable, task_id: str, template: str, step: int, own_step_s: float | None) -> float:
        """Predicted seconds until the sample ends (larger: finishes later, served first); recorded for ``rho``."""
        remaining = self.remaining(task_id, template, step)
        self.pending.setdefault(sample, []).append((step, remaining))
        if own_step_s is None:
            own_step_s = sum(self.step_s) / len(self.step_s) if self.step_s else 1.0
        return remaining * own_step_s

    def step_took(self, seconds: float) -> None:
        self.step_s.append(seconds)

    def rho(self) -> float | None:
        """Spearman's rho of predicted against actual remaining steps (None with fewer than 3 settled or no
        spread on either side)."""
        if len(self.settled) < 3:
            return None
        predicted, actual = zip(*self.settled, strict=True)
        if len(set(predicted)) < 2 or len(set(actual)) < 2:
            return None
        return round(spearman(predicted, actual), 4)


def _ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rank correlation: Pearson's of the ranks (here, not scipy's: a first import of scipy.stats takes
    seconds, and the statistics are read on the event loop)."""
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    sy = math.sqrt(sum((b - my) ** 2 for b in ry))
    return cov / (sx * sy)

"""What a run asks of speculation: ``SpecSettings`` (``bunshin eval --speculate`` and its flags).

Owns: the settings and their validation, and the names of the figures speculation reports (``STATISTICS``). The
selector is ``selector.py``; branches, slots and tail priority are ``branch.py``, ``slots.py``, ``tail.py``; what
the samples share is ``shared.py``; ``speculator.py`` ties them to the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# ``RolloutEngine.speculation_statistics()``: cumulative counts and seconds since the engine started, except the
# gauges (states at the time asked).
STATISTICS = {
    "decisions": "tool calls and final actions the policy decided while speculation was on",
    "predicted": "decisions the selector had a prediction for (any probability)",
    "late_predictions": "decisions that came before their prediction (scored when it came; no branch for them)",
    "top1_hits": "decisions whose call was the selector's first prediction",
    "topk_hits": "decisions whose call was among the selector's top k",
    "spec_top1": "top1_hits / decisions",
    "spec_topk": "topk_hits / decisions",
    "speculated": "branches started (a fork running predicted calls)",
    "adopted": "branches whose call matched the real one (their workspace and observation became the sample's)",
    "wasted": "branches discarded (wrong call) or cancelled (the sample ended, or lost its slot)",
    "skipped_threshold": "decisions whose best prediction was below the threshold",
    "skipped_read_only": "predictions not speculated because the call is not declared read-only (read-only mode)",
    "skipped_slots": "predictions that cleared the threshold but got no slot, memory or CPU before the real call came",
    "cpu_refused": "times the CPU rule (``cpu_limit``) held back a branch that had a slot and memory (each recheck "
                   "counts)",
    "cpu_busy": "gauge: the machine's cores' busy fraction over the CPU rule's last window (0 without the rule)",
    "preempted": "branches cancelled to give their slot to a sample predicted to finish later",
    "adopted_s": "tool-seconds of adopted branches (work the sample did not wait for, or waited less for)",
    "hidden_s": "of adopted_s, the part that ran while the model was still reasoning",
    "wasted_s": "tool-seconds spent in branches thrown away (a cancelled call counts until cancelled)",
    "branch_bytes_peak": "the most private memory the branches held at once",
    "branch_bytes": "gauge: private memory the branches hold now",
    "run_bytes_high": "gauge: the most the run has held without its branches (what the headroom rule is relative to)",
    "branches_running": "gauge: branches alive now",
    "retrains": "times the selector was retrained in the background",
    "examples": "gauge: examples the selector has learned from",
    "tail_rank_rho": "how well tail priority ordered the samples: Spearman's rho between predicted and actual "
                     "remaining steps, over every prediction made (None before any rollout finished)",
}
GAUGES = ("branch_bytes", "branches_running", "examples", "branch_bytes_peak", "run_bytes_high", "spec_top1", "cpu_busy",
          "spec_topk", "tail_rank_rho")


@dataclass(frozen=True, kw_only=True)
class SpecSettings:
    """``slots``: branches running at once (tail samples first: ``tail.py``); ``threshold``: the probability the
    selector's first prediction must reach to be speculated; ``memory_headroom``: the branches may lift the run's
    memory at most this fraction above the most the run has held without them (None: no such rule);
    ``memory_budget``: bytes the branches may hold together (None: no such cap); both None: unbounded
    (``memory.py``); ``read_only``: speculate only calls the suite declares read-only
    (``Suite.read_only``), as systems without forks must; ``depth``: predicted calls one branch runs in a row when
    the next prediction also clears the threshold; ``top_k``: predictions kept for top-k accuracy;
    ``train_file``: recorded trajectories (JSON Lines) the selector learns from before the first rollout;
    ``model_dir``: where the selector is saved and loaded (the prefix cache's directory when it has one);
    ``retrain_every``: new examples that start a background retrain; ``cpu_limit``: no branch starts while the
    machine's cores were at least this busy (a fraction, over the last half second; None: no such rule,
    ``cpu.py``)."""

    slots: int = 4
    threshold: float = 0.5
    memory_headroom: float | None = 0.10
    memory_budget: int | None = None
    read_only: bool = False
    depth: int = 2
    top_k: int = 3
    train_file: Path | None = None
    model_dir: Path | None = None
    retrain_every: int = 16
    cpu_limit: float | None = None

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError(f"speculation slots must be >= 1, got {self.slots}")
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"speculation threshold must be a probability in [0, 1], got {self.threshold}")
        if self.memory_headroom is not None and not 0.0 <= self.memory_headroom <= 10.0:
            raise ValueError(f"speculation memory headroom must be a fraction in [0, 10], got {self.memory_headroom}")
        if self.memory_budget is not None and self.memory_budget < 0:
            raise ValueError(f"speculation memory budget must be >= 0 bytes, got {self.memory_budget}")
        if self.cpu_limit is not None and not 0.0 < self.cpu_limit <= 1.0:
            raise ValueError(f"speculation CPU limit must be a fraction in (0, 1], got {self.cpu_limit}")
        if self.depth < 1 or self.top_k < 1 or self.retrain_every < 1:
            raise ValueError(f"depth, top_k and retrain_every must be >= 1, got {self.depth}, {self.top_k}, "
                             f"{self.retrain_every}")
        for name in ("train_file", "model_dir"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, Path(value))

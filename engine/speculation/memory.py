"""The branches' memory: what the speculative branches hold, and whether one more may start.

Owns: ``BranchMemory``. Each live branch's measured charge (its cgroup's: the pages it has written since its fork,
its page tables and kernel memory; pages it still shares with its sample are not charged to it), the estimate of
what a branch comes to hold (the largest charge of the branches closed lately: a branch just forked holds nothing
yet but will), the run's high-water mark without its branches, and the rule ``allows()``. What a new branch would
make the branches hold, ``reserved()``, is every live branch at its measured charge or, until it has grown to it,
at the estimate, plus the estimate for the one asking. Then:
- ``budget`` (bytes): ``reserved()`` stays within it;
- ``headroom`` (a fraction h): the run with its branches stays within (1 + h) x the most the run has held without
  them, i.e. ``reserved() <= (1 + h) * high - now``, ``now`` the run's memory less what its branches hold. At the
  run's peak that is h of the peak; when the run holds less (its last rollouts, fewer of them running) the branches
  may use what the run has already shown it needs, so speculation serves the tail without raising the peak.
  A branch is always allowed under this rule when none is alive (a run smaller than a branch's estimate / h would never speculate).
Both rules apply when both are set; neither: unbounded. Readings lag (the branches are measured every
``speculator.MEASURE_EVERY_S``), so the rule bounds what the branches hold, give or take what one interval adds.
Must never: read anything but through the callables it is given (the run's charge, a branch's charge): it is the
speculator's decision code, tested without workspaces.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Hashable

INITIAL_ESTIMATE = 32 << 20  # a web-shop branch's charge after one page: 7 to 26 MiB measured (host.fork_friendly_malloc)
RECENT = 64  # closed branches the estimate looks back on


class BranchMemory:
    def __init__(self, *, budget: int | None, headroom: float | None, run_memory: Callable[[], int],
                 initial_estimate: int = INITIAL_ESTIMATE):
        self.budget, self.headroom, self.run_memory = budget, headroom, run_memory
        self.estimate = initial_estimate
        self.measured: dict[Hashable, int] = {}  # live branches: their charge at the last measurement (0 before)
        self.high = 0  # the most the run has held without its branches, as measured
        self.peak = 0  # the most the branches have held at once, as measured
        self._recent: collections.deque[int] = collections.deque(maxlen=RECENT)

    # -- branches come and go ---------------------------------------------------------------------------------
    def opened(self, branch: Hashable) -> None:
        self.measured[branch] = 0

    def closed(self, branch: Hashable) -> None:
        """The branch was closed or adopted (its memory is its sample's now): its last charge teaches the estimate."""
        charge = self.measured.pop(branch, 0)
        if charge:
            self._recent.append(charge)
            self.estimate = max(self._recent)

    def measure(self, charges: dict[Hashable, int]) -> None:
        """New charges of live branches (a branch not listed keeps its last), and the run's memory now: the
        high-water mark moves only here, where the two readings are taken together (between readings a branch's
        growth would look like the run's and lift the mark)."""
        for branch, charge in charges.items():
            if branch in self.measured:
                self.measured[branch] = charge
        held = self.held()
        self.peak = max(self.peak, held)
        self.high = max(self.high, self.run_memory() - held)

    # -- the rule -------------------------------------------------------------------------------------------------
    def held(self) -> int:
        """What the live branches held at the last measurement."""
        return sum(self.measured.values())

    def reserved(self) -> int:
        """What the branches would hold with one more: each at its charge or the estimate, plus the estimate."""
        return sum(max(b, self.estimate) for b in self.measured.values()) + self.estimate

    def allows(self) -> bool:
        """Whether one more branch may start (see the module's docstring)."""
        reserved = self.reserved()
        if self.budget is not None and reserved > self.budget:
            return False
        if self.headroom is not None:
            now = max(0, self.run_memory() - self.held())  # branches grown since their last reading count as run
            if self.measured and reserved > (1.0 + self.headroom) * self.high - now:  # the first always may
                return False
        return True

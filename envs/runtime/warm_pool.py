"""The warm pool: workspaces prepared ahead (slots) whose app has started its long-lived programs (a browser), for
the running clones of an app that names them (``AppSpec.warm``) to take over instead of starting their own.

Owns: what a slot is and how the pool of them is sized. A slot is a workspace running the warm app, kept by a
``ReadyPool`` keyed by that app (``ready_pool.py``: up to ``size`` per app within the budget, refilled in the
background once the fork that took one has ended, closed at the run's end if nobody took it). A slot handed out is
the pool's no longer: the clone joins the slot's cgroup and network namespace, its app takes what the slot's app
lent (``Lend``), and the slot's host and layer are removed with the clone (``HostWorkspace.companions``).
Must never: count a slot whose host died as ready.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ..records import AppSpec
from .host_workspace import HostWorkspace
from .ready_pool import PoolStats, Preparation, ReadyPool
from .task_scope import TaskScope

__all__ = ["BUDGET_SHARE", "DEFAULT_SIZE", "PoolStats", "WarmPool", "default_budget"]

DEFAULT_SIZE = 2  # ready slots per warm app: a group's first forks hit, the pool refills while they run
BUDGET_SHARE = 0.5  # without a budget: half the memory the host had available when the run started


class WarmPool(ReadyPool[AppSpec, HostWorkspace]):
    """``start_slot(spec)``: a new workspace running ``spec`` (registered nowhere); ``charge()``: the run's memory
    charge now; ``tasks``: the run's scope the refills run in."""

    def __init__(self, start_slot: Callable[[AppSpec], Awaitable[HostWorkspace]], charge: Callable[[], int],
                 tasks: TaskScope, *, size: int = DEFAULT_SIZE, budget_bytes: int | None = None):
        prep: Preparation[AppSpec, HostWorkspace] = Preparation(
            make=start_slot, discard=lambda slot: slot.close(), usable=lambda slot: not (slot.broken or slot.closed),
            cost=lambda slot: slot.charge(), name=lambda spec: f"warm pool {spec.target}")
        super().__init__(prep, charge, tasks, size=size,
                         budget_bytes=budget_bytes if budget_bytes is not None else default_budget())


def default_budget() -> int:
    """``BUDGET_SHARE`` of the host's available memory now (``MemAvailable``)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(int(line.split()[1]) * 1024 * BUDGET_SHARE)
    except OSError:
        pass
    return 1 << 30

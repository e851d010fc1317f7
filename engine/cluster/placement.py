"""Placement of GRPO groups on a cluster's nodes, and the ledger of every sample: pure decisions, no I/O, no Ray.

Owns: ``NodeView`` (what the driver knows of a node: alive or not, its agent's memory charge, budget and estimate
of one more rollout as last reported, the samples in flight there, its slots, the application roots and the tasks'
prefix trees it holds),
``Work`` (a group, or the samples of it still to run, with its application's key), ``place`` (which waiting work
goes to which node now) and ``Ledger`` (every sample's state: waiting, on a node, delivered; what a dead node's
loss puts back to wait). The rules of ``place``, in order:

1. A node is eligible for a piece of work when it is alive, has a free slot (fewer samples in flight than
   ``slots``), and, with a budget, its projected memory (the charge it reported plus ``estimate`` for every sample
   sent to it since that report) plus the work's cost fits the budget. An idle node (nothing in flight) is always
   eligible: a group too large for any budget must still make progress (as ``admission.py`` lets one rollout run).
2. The work's cost is ``estimate`` per sample, plus ``root_estimate`` on a node that holds no root of the work's
   application (the group would make one there).
3. Among eligible nodes, those holding the prefix tree of the work's task come first (with the prefix cache on,
   ``prefixes=True``: a group is served the calls an earlier group of its task made there), then those holding the
   work's root (fork locality: the group forks a root that is there), then the most free memory (a new root goes
   where memory is free), then the fewest samples in flight, then the node's order.
4. Work is taken first come, first served: the first piece that fits nowhere waits, and so does everything behind
   it (a large group is never starved by small ones passing it).

Must never: do I/O or read a clock; give a sample to two nodes at once; forget a sample (every sample is waiting,
on exactly one live node, or delivered exactly once).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from collections.abc import Iterable, Sequence

from ..errors import EngineError
from ..records import RolloutRequest

MiB = 1 << 20
ROOT_ESTIMATE = 512 * MiB  # what making an application's root on a node may take before any was measured


def app_key(spec_json: bytes) -> str:
    """The short key of an application (``msgspec.json.encode(suite.app(task))``), as the agents report roots."""
    return hashlib.sha256(spec_json).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class NodeView:
    node_id: str
    slots: int  # samples the node's agent runs at once (its engine's concurrency)
    alive: bool = True
    charge: int = 0  # the agent's run's memory charge at its last report
    budget: int | None = None  # the agent's memory budget (None: unbounded)
    estimate: int = 64 * MiB  # what one more rollout may take there (its admission's estimate)
    in_flight: int = 0  # samples sent to the node and not yet delivered
    sent_since_report: int = 0  # samples sent since ``charge`` was reported (not in the charge yet)
    roots: frozenset[str] = frozenset()  # application keys whose root the node holds (or will: a group was sent)
    prefixes: frozenset[str] = frozenset()  # task ids whose prefix tree the node's cache holds (or will)

    def projected(self) -> int:
        return self.charge + self.sent_since_report * self.estimate

    def free(self) -> float:
        return float("inf") if self.budget is None else self.budget - self.projected()

    def cost(self, work: Work, root_estimate: int) -> int:
        return len(work.samples) * self.estimate + (0 if work.app in self.roots else root_estimate)

    def fits(self, work: Work, root_estimate: int) -> bool:
        if not self.alive:
            return False
        if self.in_flight == 0:
            return True
        if self.in_flight >= self.slots:
            return False
        return self.free() >= self.cost(work, root_estimate)


@dataclasses.dataclass(frozen=True)
class Work:
    """A group, or the samples of it still to run. ``attempts``: how many times these samples were started before
    (0 the first time); ``app``: the key of the application its task runs on."""

    request: RolloutRequest
    app: str
    samples: tuple[int, ...]
    attempts: int = 0

    @property
    def group_id(self) -> str:
        return self.request.group_id or self.request.task.task_id

    @property
    def task_id(self) -> str:
        return self.request.task.task_id

    def as_request(self) -> RolloutRequest:
        """The request an agent runs: the same group (its seeds derive from it), only these samples."""
        import msgspec

        return msgspec.structs.replace(self.request, samples=list(self.samples))


def place(waiting: Sequence[Work], nodes: Sequence[NodeView], root_estimate: int = ROOT_ESTIMATE,
          prefixes: bool = False) -> tuple[list[tuple[Work, str]], list[NodeView]]:
    """Which of ``waiting`` (in order) go to which node now, and the nodes as they are once it is sent (more in
    flight, the root held, with ``prefixes`` the task's prefix tree too). Inputs are not changed."""
    views = list(nodes)
    placed: list[tuple[Work, str]] = []
    for work in waiting:
        eligible = [(n, v) for n, v in enumerate(views) if v.fits(work, root_estimate)]
        if not eligible:
            break
        n, view = min(eligible, key=lambda nv: (work.task_id not in nv[1].prefixes, work.app not in nv[1].roots,
                                                -nv[1].free(), nv[1].in_flight, nv[0]))
        views[n] = dataclasses.replace(view, in_flight=view.in_flight + len(work.samples),
                                       sent_since_report=view.sent_since_report + len(work.samples),
                                       roots=view.roots | {work.app},
                                       prefixes=view.prefixes | {work.task_id} if prefixes else view.prefixes)
        placed.append((work, view.node_id))
    return placed, views


class SampleState(enum.Enum):
    WAITING = "waiting"
    SENT = "sent"
    DELIVERED = "delivered"


class LedgerError(EngineError):
    """The driver broke the ledger's rules (a bug of ``engine/cluster``: never a node's or a rollout's fault)."""


class Ledger:
    """Every sample of a batch, by (group id, sample): waiting, sent to one node, or delivered once."""

    def __init__(self) -> None:
        self.state: dict[tuple[str, int], SampleState] = {}
        self.node: dict[tuple[str, int], str] = {}
        self.attempts: dict[tuple[str, int], int] = {}
        self.sent: dict[str, dict[tuple[str, int], Work]] = {}  # node -> sample -> the work it went with

    def add(self, work: Work) -> None:
        for s in work.samples:
            key = (work.group_id, s)
            if key in self.state:
                raise LedgerError(f"sample {key} is in the batch twice")
            self.state[key] = SampleState.WAITING
            self.attempts[key] = work.attempts

    def send(self, work: Work, node: str) -> None:
        for s in work.samples:
            key = (work.group_id, s)
            if self.state.get(key) is not SampleState.WAITING:
                raise LedgerError(f"sample {key} sent while {self.state.get(key)}")
        for s in work.samples:
            key = (work.group_id, s)
            self.state[key] = SampleState.SENT
            self.node[key] = node
            self.attempts[key] += 1
            self.sent.setdefault(node, {})[key] = work

    def deliver(self, group_id: str, sample: int, node: str) -> bool:
        """A result came from ``node``: True the first time (pass it on), False for one already delivered or not
        sent there (drop it: a sample ends exactly once)."""
        key = (group_id, sample)
        if self.state.get(key) is not SampleState.SENT or self.node.get(key) != node:
            return False
        self.state[key] = SampleState.DELIVERED
        del self.sent[node][key]
        return True

    def lost(self, node: str) -> list[Work]:
        """``node`` died: its samples not delivered wait again, regrouped by the work they went with (the same
        request: the same seeds), with the attempts they had."""
        back: dict[int, tuple[Work, list[int]]] = {}
        for (group_id, s), work in self.sent.pop(node, {}).items():
            self.state[(group_id, s)] = SampleState.WAITING
            del self.node[(group_id, s)]
            back.setdefault(id(work), (work, []))[1].append(s)
        return [dataclasses.replace(work, samples=tuple(sorted(samples)), attempts=work.attempts + 1)
                for work, samples in back.values()]

    def abandon(self, work: Work) -> list[int]:
        """No node is left for ``work``: its waiting samples end here (the caller reports each as failed)."""
        ended = []
        for s in work.samples:
            key = (work.group_id, s)
            if self.state.get(key) is SampleState.WAITING:
                self.state[key] = SampleState.DELIVERED
                ended.append(s)
        return ended

    def close_sent(self, work: Work, node: str) -> list[int]:
        """``work``'s call on ``node`` ended (normally or with the agent's error): its samples not delivered end
        here (the caller reports each as failed); none are lost, none run twice."""
        ended = []
        for s in work.samples:
            key = (work.group_id, s)
            if self.state.get(key) is SampleState.SENT and self.node.get(key) == node:
                self.state[key] = SampleState.DELIVERED
                del self.sent[node][key]
                ended.append(s)
        return ended

    def done(self) -> bool:
        return all(v is SampleState.DELIVERED for v in self.state.values())

    def in_flight(self, node: str) -> int:
        return len(self.sent.get(node, {}))


def works(requests: Iterable[RolloutRequest], app_of: dict[str, str]) -> list[Work]:
    """The batch as work: one piece per request, its application's key from ``app_of`` (task id -> key; an unknown
    task gets the empty key, and fails on its node as on one host)."""
    return [Work(request=r, app=app_of.get(r.task.task_id, ""), samples=tuple(r.sample_indices())) for r in requests]

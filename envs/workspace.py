"""The Workspace contract of docs/design.md section 3: what the engine and the suites may ask of a workspace.

Owns: the abstract ``Workspace`` (run a tool call, fork, snapshot, image, memory, charge, close) and ``Snapshot``
(a frozen fork: it runs no tools), the ``ForkTiming`` a clone reports, the ``WorkspaceImage`` protocol of a durable
image, and ``deadline_s`` (how long a tool call may take before its workspace is stopped). The workspace made of
Linux primitives is ``runtime/host_workspace.py``'s ``HostWorkspace``; a second implementation subclasses
``Workspace`` (or ``Snapshot``) the same way and passes the same contract tests.
Must never: import the runtime (``envs.runtime``), at any level: the contract is below every implementation.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

from .errors import RequestRefused
from .records import AppSpec, Limits, MemoryStats, Observation, ToolCall


@dataclass(frozen=True)
class ForkTiming:
    """``freeze_s``: how long the source stopped for this fork; ``ready_s``: from the fork request until the clone
    answered Ready (the clone's cgroup, layer and process included, for every backend). ``dump_reused``: a
    private restore from a dump an earlier fork of the same source state made (no freeze; not in ``ready_s``)."""

    freeze_s: float
    ready_s: float
    dump_reused: bool = False
    warm_slot: bool = False  # a live fork whose clone took over a warm-pool slot's programs (a browser): a hit
    clone_steps_s: dict[str, float] = field(default_factory=dict)  # the live clone's setup by step (cow)
    one_step: bool = False  # a live clone forked in one step as its source's sibling (cow, ``fork/sibling.py``)
    source_cpu_s: float = 0.0  # the source's CPU for this fork (cow: its middle process's included)
    shell: bool = False  # a live clone that took a prepared shell (its cgroup and namespaces made ahead, cow)


class WorkspaceImage(Protocol):
    """A durable image of one workspace state (``Workspace.image``): the state images, the host's then each
    worker's (``files``, each a whole checkpoint file), and the overlayfs upper tree of a read-only snapshot of its
    files (``layer_upper``), which a checkpoint store diffs."""

    @property
    def name(self) -> str: ...
    @property
    def source(self) -> str: ...  # the imaged workspace's id
    @property
    def files(self) -> tuple[Path, ...]: ...
    @property
    def workers(self) -> int: ...
    @property
    def layer_upper(self) -> Path: ...
    @property
    def bytes_written(self) -> int: ...
    @property
    def freeze_s(self) -> float: ...
    @property
    def discarded(self) -> bool: ...

    def read_parts(self) -> Sequence[bytes]:
        """Every file whole, in order: what ``WorkspaceRuntime.restore_image`` takes back. Blocking."""
        ...

    def discard(self) -> None:
        """Remove the image's files and layer. Idempotent, thread-safe, blocking."""
        ...


def call_timeouts(timeout_s: float | None, limits: Limits) -> tuple[float, float]:
    """A tool call's own time (``timeout_s``, default ``limits.command_timeout_s``) and its ``deadline_s``; a
    timeout that is not a positive finite number of seconds raises ``ValueError``."""
    timeout = limits.command_timeout_s if timeout_s is None else float(timeout_s)
    if not 0 < timeout < math.inf:
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    return timeout, deadline_s(timeout, limits)


def deadline_s(timeout_s: float, limits: Limits) -> float:
    """How long the runtime waits for a tool call asked to finish within ``timeout_s``: the call's own time, plus
    the grace a host needs to stop a command that ran out of time and to answer (observations, screenshots)."""
    return timeout_s + max(limits.deadline_grace_s, 0.25 * timeout_s)


class Workspace(abc.ABC):
    """A running, isolated computer. Create it with ``WorkspaceRuntime.create``; fork it with ``fork()``.

    Identity (``id``, ``seed``, ``app_spec``; ``parent`` and ``generation`` for a clone) is fixed at creation;
    ``broken`` is the reason it can no longer be used (None while it can); ``last_fork`` is set on clones."""

    frozen: ClassVar[bool] = False

    def __init__(self, ws_id: str, *, seed: int, app: AppSpec, parent: str | None, generation: int):
        self.id = ws_id
        self.seed = seed
        self.app_spec = app
        self.parent = parent
        self.generation = generation
        self.broken: str | None = None
        self.last_fork: ForkTiming | None = None

    @abc.abstractmethod
    async def execute(self, call: ToolCall, timeout_s: float | None = None) -> Observation:
        """Run one tool call within ``timeout_s`` (default: the runtime's ``Limits.command_timeout_s``). A call that
        does not come back by ``deadline_s`` raises ``CallDeadlineExceeded`` and leaves the workspace broken; a
        workspace that died or went over its limits raises ``WorkspaceBroken``; a closed one ``WorkspaceClosed``."""

    @abc.abstractmethod
    async def fork(self, *, seed: int | None = None) -> Workspace:
        """A live copy-on-write clone that runs on its own; this workspace keeps running. Raises ``ForkFailed``;
        a failed or cancelled fork leaves nothing behind."""

    @abc.abstractmethod
    async def snapshot(self) -> Snapshot:
        """A frozen fork: it runs nothing and can be forked again later."""

    @abc.abstractmethod
    async def image(self, name: str) -> WorkspaceImage:
        """A durable image of the current state (a Snapshot's too), labelled ``name``; ``discard()`` it once
        stored. Raises ``ImageFailed``, ``WorkspaceBroken``, ``WorkspaceClosed``; nothing is left then."""

    @abc.abstractmethod
    def memory(self) -> MemoryStats:
        """PSS, private and shared memory summed over the workspace's processes, and its charge (blocking: call it
        in a thread)."""

    @abc.abstractmethod
    def charge(self) -> int:
        """The bytes the workspace is charged for now: cheap."""

    @property
    @abc.abstractmethod
    def closed(self) -> bool:
        """``close()`` has been called."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop the workspace and remove everything it held. Finishes even when the caller is cancelled; a second
        call (concurrent or later) returns once the first one's teardown has finished."""


class Snapshot(Workspace):
    """A frozen fork. Its processes wait, its files are read-only; ``fork()`` makes running clones of it."""

    frozen: ClassVar[bool] = True

    async def execute(self, call: ToolCall, timeout_s: float | None = None) -> Observation:
        raise RequestRefused(self.id, "bad_request", "a snapshot runs no tools; fork it first")

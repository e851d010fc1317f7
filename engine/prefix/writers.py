"""Background checkpoint writers: turn hot prefix-tree nodes cold on the engine's event loop, off the critical path.

Owns: a bounded queue of write jobs, ``workers`` writer tasks in a task group (``open_writers``), and the metrics
(``statistics()``: the bound, queued, in flight, written, failed, dropped, abandoned, bytes written against a full
checkpoint's). ``submit_nowait`` never waits: a full backlog answers ``DROPPED`` and the node simply stays hot or
absent. A job runs ``CheckpointStore.plan_node`` in a thread (hashing and the layer diff are CPU and stat work,
aiofiles has no such call), then places each file: written with aiofiles, fsynced with ``asyncio.to_thread``
(aiofiles has no fsync), renamed with ``aiofiles.os.replace``, directories fsynced in a thread (an ``O_DIRECTORY``
descriptor, which aiofiles cannot open); the store's ``finish`` registers the node. A child whose parent is being
written waits for it; a child whose parent is not in the store is written whole (its files against nothing).
Cancellation lands between files: a file being placed is finished first (a thread cannot be interrupted), then
the job is undone (``CheckpointStore.abort``: its temporary files, and the chunks only it placed) and reported
abandoned. A job's ``done`` callback runs on the loop exactly once for every job that was queued.
Must never: block the event loop for more than a few unlinks, make a fork wait, or leave a temporary file behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiofiles
import aiofiles.os
import msgspec

from bunshin.envs.framing import fsync_dir
from bunshin.envs.runtime.task_scope import run_to_end

from .errors import StoreError
from .store import Buffer, CheckpointStore, NodeRecord, Pending, Plan

QUEUED, DROPPED, CLOSED = "queued", "dropped (backlog full)", "closed"


class Written(msgspec.Struct, frozen=True, kw_only=True, tag="written"):
    record: NodeRecord


class WriteFailed(msgspec.Struct, frozen=True, kw_only=True, tag="failed"):
    """``kind``: full (no space), io, source (``parts`` failed), abandoned (the writers closed)."""

    node_id: str
    kind: str
    reason: str


Outcome = Written | WriteFailed


class WriterStats(msgspec.Struct, frozen=True, kw_only=True):
    backlog_bound: int
    queued: int
    in_flight: int
    written: int
    failed: int
    dropped: int
    abandoned: int
    bytes_written: int
    full_bytes: int


@dataclass(frozen=True)
class Prepared:
    """What a job's ``parts`` callable may return instead of the parts alone: the parts and the node's layer tree,
    when the layer only exists once the state is imaged (``layer`` then overrides the job's)."""

    parts: Sequence[Buffer]
    layer: Path | None


@dataclass(frozen=True, kw_only=True)
class WriteJob:
    """``parts``: the state's parts, or an async callable returning them (or a ``Prepared``) when a writer starts
    the job (so a queued job holds no dump). ``layer``/``parent_layer``: the node's and its parent's layer trees
    (overlayfs ``upper``)."""

    node_id: str
    parts: Sequence[Buffer] | Callable[[], Awaitable[Sequence[Buffer] | Prepared]]
    layer: Path | None = None
    parent: str | None = None
    parent_layer: Path | None = None
    done: Callable[[Outcome], None] | None = None


class CheckpointWriters:
    def __init__(self, store: CheckpointStore, backlog: int):
        if backlog < 1:
            raise ValueError("the backlog bound must be >= 1 (asyncio reads 0 as unbounded)")
        self.store, self.backlog = store, backlog
        self._queue: asyncio.Queue[WriteJob] = asyncio.Queue(maxsize=backlog)
        self._writing: dict[str, asyncio.Event] = {}
        self._closed = False
        self._n: dict[str, int] = dict.fromkeys(("written", "failed", "dropped", "abandoned", "bytes", "full"), 0)
        self._tasks: list[asyncio.Task[None]] = []

    def submit_nowait(self, job: WriteJob) -> str:
        """``QUEUED``, ``DROPPED`` (backlog full: the node stays as it is) or ``CLOSED``; never waits."""
        if self._closed:
            return CLOSED
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            self._n["dropped"] += 1
            return DROPPED
        return QUEUED

    def statistics(self) -> WriterStats:
        n = self._n
        return WriterStats(backlog_bound=self.backlog, queued=self._queue.qsize(), in_flight=len(self._writing),
                           written=n["written"], failed=n["failed"], dropped=n["dropped"], abandoned=n["abandoned"],
                           bytes_written=n["bytes"], full_bytes=n["full"])

    async def wait_idle(self) -> None:
        """Until every queued job has finished."""
        await self._queue.join()

    async def _run(self) -> None:
        while True:
            job = await self._queue.get()
            self._writing[job.node_id] = event = asyncio.Event()
            try:
                outcome = await self._write(job)
            except asyncio.CancelledError:
                self._report(job, WriteFailed(node_id=job.node_id, kind="abandoned", reason="writers closed"))
                raise
            finally:
                self._writing.pop(job.node_id, None)
                event.set()
                self._queue.task_done()
            self._report(job, outcome)

    async def _write(self, job: WriteJob) -> Outcome:
        store, parent = self.store, job.parent
        if parent is not None and parent in self._writing:
            await self._writing[parent].wait()
        parent_layer = job.parent_layer
        if parent is not None and not store.has(parent):
            parent = parent_layer = None  # the parent was dropped or never written: this node stands alone
        layer = job.layer
        try:
            got = await job.parts() if callable(job.parts) else job.parts
        except Exception as exc:  # the snapshot could not give its state: the node stays as it is
            return WriteFailed(node_id=job.node_id, kind="source", reason=f"{type(exc).__name__}: {exc}")
        parts = got.parts if isinstance(got, Prepared) else got
        if isinstance(got, Prepared):
            layer = got.layer
        try:
            plan = await run_to_end(asyncio.to_thread(store.plan_node, job.node_id, parts, layer, parent=parent,
                                                  parent_layer=parent_layer), undo=store.abort)
        except (StoreError, OSError) as exc:  # a bad node id, an unreadable layer
            return WriteFailed(node_id=job.node_id, kind="io", reason=str(exc))
        try:
            for pending in plan.chunks:
                await run_to_end(self._place(plan, pending))
            for directory in {p.final.parent for p in plan.chunks}:
                await run_to_end(asyncio.to_thread(fsync_dir, directory))
            await run_to_end(self._place(plan, plan.manifest_file))
            await run_to_end(asyncio.to_thread(fsync_dir, store.nodes))
        except OSError as exc:
            store.abort(plan)
            error = store.translate(exc, plan)
            kind = "full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "io"
            return WriteFailed(node_id=job.node_id, kind=kind, reason=str(error))
        except BaseException:
            store.abort(plan)  # a few unlinks: short, and it must finish
            raise
        return Written(record=store.finish(plan))

    async def _place(self, plan: Plan, pending: Pending) -> None:
        tmp = self.store.new_temp(plan)
        async with aiofiles.open(tmp, "xb") as f:
            for blob in pending.blobs:
                await f.write(blob)
            self.store.fault("chunk.written" if pending.cid else "manifest.written")
            await f.flush()
            await asyncio.to_thread(os.fsync, f.fileno())
        await aiofiles.os.replace(tmp, pending.final)
        self.store.placed(plan, pending, tmp)

    def _report(self, job: WriteJob, outcome: Outcome) -> None:
        match outcome:
            case Written(record=record):
                self._n["written"] += 1
                self._n["bytes"] += record.bytes_written
                self._n["full"] += record.full_bytes
            case WriteFailed(kind="abandoned"):
                self._n["abandoned"] += 1
            case WriteFailed():
                self._n["failed"] += 1
        if job.done is not None:
            job.done(outcome)

    async def _close(self, abandon: bool) -> None:
        self._closed = True
        if not abandon:
            await self._queue.join()
        while not self._queue.empty():
            job = self._queue.get_nowait()
            self._queue.task_done()
            self._report(job, WriteFailed(node_id=job.node_id, kind="abandoned", reason="writers closed"))
        for task in self._tasks:
            task.cancel()


@contextlib.asynccontextmanager
async def open_writers(store: CheckpointStore, *, workers: int = 2, backlog: int = 16,
                       abandon_on_exit: bool = False) -> AsyncIterator[CheckpointWriters]:
    """The writers, running until the block exits: then queued jobs are written (or, with ``abandon_on_exit``,
    or when the block raises, abandoned) and the writer tasks end."""
    writers = CheckpointWriters(store, backlog)
    async with asyncio.TaskGroup() as group:
        writers._tasks = [group.create_task(writers._run(), name=f"checkpoint-writer-{i}") for i in range(workers)]
        try:
            yield writers
        except BaseException:
            await writers._close(abandon=True)
            raise
        await writers._close(abandon=abandon_on_exit)

"""Fork backends: one interface, chosen per run.

- ``cow``: the userspace live fork. The source host snapshots its layer (btrfs, constant time) and ``fork()``s
  itself; the clone enters fresh namespaces and its own cgroup, mounts its own root and answers on a new socket.
  No application memory is copied: clones share every page they do not write.
- ``restore``: the private-restore baseline. The source writes a checkpoint of its application state; a fresh
  host starts from the image and restores the state into private memory, as CRIU's restore does.

Owns: the fork sequence on the engine's side, with the undo of every step on failure (the source keeps running).
Must never: leave a half-made clone (cgroup, layer, process) behind when a fork fails or is cancelled.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from .errors import ForkFailed, RequestRefused, WorkspaceStartFailed
from .records import CloneSpec, Fork, Forked
from .seeds import derive_seed
from .workspace import ForkTiming, Snapshot, Workspace

if TYPE_CHECKING:
    from .runtime import WorkspaceRuntime

BACKENDS = ("cow", "restore")


class ForkBackend(Protocol):
    name: str

    async def fork(self, source: Workspace, *, seed: int | None, frozen: bool) -> Workspace: ...


def make_backend(name: str, runtime: WorkspaceRuntime) -> ForkBackend:
    if name == "cow":
        return CowFork(runtime)
    if name == "restore":
        return PrivateRestore(runtime)
    raise ValueError(f"unknown fork backend {name!r} (known: {', '.join(BACKENDS)})")


def _clone_seed(source: Workspace, seed: int | None) -> int:
    source.forks += 1
    return derive_seed(source.seed, "fork", source.forks) if seed is None else seed


async def all_or_nothing(make: Coroutine[Any, Any, Workspace]) -> Workspace:
    """Run a fork to its end even if the caller is cancelled (forks are short), then undo it: a cancelled fork
    leaves no clone behind, and a source whose fork was cancelled has a channel in step."""
    inner = asyncio.ensure_future(make)
    try:
        return await asyncio.shield(inner)
    except asyncio.CancelledError:
        clone = None
        while not inner.done():  # however often we are cancelled meanwhile: the fork is short
            try:
                await asyncio.shield(inner)
            except asyncio.CancelledError:
                continue
            except Exception:
                break
        if not inner.cancelled() and inner.exception() is None:
            clone = inner.result()
        if clone is not None:
            await asyncio.shield(clone.close())
        raise


class CowFork:
    name = "cow"

    def __init__(self, runtime: WorkspaceRuntime):
        self.runtime = runtime

    async def fork(self, source: Workspace, *, seed: int | None, frozen: bool) -> Workspace:
        return await all_or_nothing(self._fork(source, seed=seed, frozen=frozen))

    async def _fork(self, source: Workspace, *, seed: int | None, frozen: bool) -> Workspace:
        rt = self.runtime
        clone_id = rt.new_id()
        spec = CloneSpec(ws_id=clone_id, hostname=f"ws-{clone_id}", seed=_clone_seed(source, seed),
                         layer=f"ws-{clone_id}", cgroup_rel=f"ws-{clone_id}", frozen=frozen)
        group = await asyncio.to_thread(rt.new_cgroup, clone_id)
        engine_end, clone_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        engine_end.setblocking(False)
        started = time.monotonic()
        clone: Workspace | None = None
        try:
            try:
                reply = await source.request(Fork(clone=spec), fds=[clone_end.fileno()])
            finally:
                clone_end.close()
            assert isinstance(reply, Forked)
            pid = await rt.await_ready(clone_id, engine_end)
            cls = Snapshot if frozen else Workspace
            clone = cls(rt, clone_id, pid=pid, sock=engine_end, cgroup=group, layer=spec.layer, seed=spec.seed,
                        app=source.app_spec, parent=source.id, generation=source.generation + 1)
            clone.last_fork = ForkTiming(freeze_s=reply.freeze_ns / 1e9, ready_s=time.monotonic() - started)
        except BaseException as exc:
            engine_end.close()
            await asyncio.shield(asyncio.to_thread(rt._remove_remains, group, spec.layer, clone_id))
            if isinstance(exc, RequestRefused | WorkspaceStartFailed):
                raise ForkFailed(source.id, f"fork to {clone_id} failed: {exc.detail}") from exc
            raise
        rt.workspaces[clone_id] = clone
        return clone


class PrivateRestore:
    name = "restore"

    def __init__(self, runtime: WorkspaceRuntime):
        self.runtime = runtime

    async def fork(self, source: Workspace, *, seed: int | None, frozen: bool) -> Workspace:
        return await all_or_nothing(self._fork(source, seed=seed, frozen=frozen))

    async def _fork(self, source: Workspace, *, seed: int | None, frozen: bool) -> Workspace:
        rt = self.runtime
        clone_id = rt.new_id()
        path = f"ckpt-{clone_id}.bin"
        ckpt_layer = f"{path}.layer"
        layer = f"ws-{clone_id}"
        started = time.monotonic()
        try:
            from .records import Checkpoint, Checkpointed

            reply = await source.request(Checkpoint(path=path, layer=ckpt_layer))
            assert isinstance(reply, Checkpointed)
            await asyncio.to_thread(rt.layers.snapshot, ckpt_layer, layer)
            clone = await rt.start_host(clone_id, layer, source.app_spec, seed=_clone_seed(source, seed),
                                        hostname=None, restore_from=path, parent=source.id,
                                        generation=source.generation + 1, cls=Snapshot if frozen else Workspace)
        except RequestRefused as exc:
            await asyncio.to_thread(rt.layers.delete, layer)
            raise ForkFailed(source.id, f"checkpoint for {clone_id} failed: {exc.detail}") from exc
        except WorkspaceStartFailed as exc:
            raise ForkFailed(source.id, f"restore into {clone_id} failed: {exc.detail}") from exc
        finally:
            await asyncio.shield(asyncio.to_thread(self._remove_checkpoint, path, ckpt_layer))
        clone.last_fork = ForkTiming(freeze_s=reply.freeze_ns / 1e9, ready_s=time.monotonic() - started)
        return clone

    def _remove_checkpoint(self, path: str, layer: str) -> None:
        try:
            os.unlink(path, dir_fd=self.runtime.pool_fd)
        except FileNotFoundError:
            pass
        self.runtime.layers.delete(layer)

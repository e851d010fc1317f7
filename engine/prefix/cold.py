"""The prefix cache's cold side, for a run with ``--cache-dir DIR``: checkpoints on disk, the tree file, restores.

Owns: the directory (``DIR/store``: the content-addressed ``CheckpointStore``; ``DIR/tree.bin``: the tree, saved
atomically after checkpoints land and when the engine closes, loaded when it starts, so a killed engine's
successor starts from the last save), the background writers that turn a hot node cold (the snapshot is imaged
into the pool's tmpfs when a writer takes the job, its files mapped, chunked and written, then removed; the
image's read-only layer is kept while the node is cold in this run, so its children's checkpoints are written as
deltas on it), deleting evicted checkpoints, and restoring a workspace from a node's checkpoint (a corrupt one is
dropped, with every delta built on it, and the node is rebuilt by replay instead), and its background work (a
``TaskScope``: deletions, file removals, the tree's saves; finished in ``close``). It is handed the cache's empty
tree and gives the loaded one back; it never sees the cache.
Must never: make a fork or a call wait for a disk write, load an unverified checkpoint, or keep an image's files
in memory longer than its write.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import time
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import Any

from bunshin.envs.runtime.image_files import FillLayer, remove_files
from bunshin.envs.runtime.task_scope import TaskScope, run_to_end
from bunshin.envs.workspace import Workspace, WorkspaceImage

from .errors import CorruptEntry, StoreError
from .node import Namespace, Node
from .persist import load_tree, save_tree
from .store import CheckpointStore
from .tree import PrefixTree
from .writers import QUEUED, CheckpointWriters, Outcome, Prepared, WriteJob, Written, open_writers

TREE_FILE = "tree.bin"
SAVE_EVERY_S = 2.0  # at most one save of the tree file this often while checkpoints land

RestoreAt = Callable[[Namespace, FillLayer, int], Awaitable[Workspace]]
"""``(ns, fill_layer, seed)``: a running workspace of ``ns``'s application whose layer ``fill_layer`` fills (the
runtime's ``restore_image`` for that namespace's task)."""


class ColdStore:
    """The cold side of one cache (module docstring). It works on ``tree``, the tree it loaded and gave the cache
    (``open``); what it needs of the cache is passed in: ``restore`` (how to start a workspace from a checkpoint,
    None when the run cannot) and ``apply_budgets`` (called when a checkpoint landed: the cache evicts)."""

    def __init__(self, directory: Path, store: CheckpointStore, tree: PrefixTree, *, restore: RestoreAt | None,
                 apply_budgets: Callable[[], None]):
        self.directory, self.store, self.tree = directory, store, tree
        self._restore, self._apply_budgets = restore, apply_budgets
        self.writers: CheckpointWriters | None = None
        self._stack = contextlib.AsyncExitStack()
        self._scope = TaskScope("prefix-cold")  # deletions, file removals, the tree's saves
        self._images: dict[str, WorkspaceImage] = {}  # checkpoint id -> its image (files gone, layer kept)
        self._submitted: set[str] = set()
        self._save_pending: asyncio.Task[None] | None = None
        self._last_save = 0.0
        self.counts: dict[str, int] = dict.fromkeys(
            ("restores", "restore_failures", "corrupt", "deleted", "saves", "save_failures", "loaded_nodes",
             "dropped_on_open"), 0)
        self.load_reason: str | None = None
        self.restore_s = 2.0  # a restore's time, measured (moving average): when a restore pays over a replay

    @classmethod
    async def open(cls, directory: Path, empty: PrefixTree, *, namespaces: Collection[Namespace], writers: int,
                   backlog: int, restore: RestoreAt | None,
                   apply_budgets: Callable[[], None]) -> tuple[ColdStore, PrefixTree]:
        """Open (or make) ``directory`` and load the saved tree, with ``empty``'s clock, budgets, strategy and
        admission; namespaces not in ``namespaces`` (other configurations and code versions) and checkpoints the
        store lost are dropped. Returns the store and the loaded tree, which replaces the cache's empty one (the
        cache then applies its budgets)."""
        directory.mkdir(parents=True, exist_ok=True)
        store = await asyncio.to_thread(CheckpointStore, directory / "store")
        try:
            loaded = await asyncio.to_thread(
                load_tree, directory / TREE_FILE, clock=empty.clock, namespace_ok=set(namespaces),
                known_checkpoints=set(store.node_ids()), hot_budget=empty.hot_budget, cold_budget=empty.cold_budget,
                strategy=empty.strategy, admission=empty.admission)
        except BaseException:
            store.close()
            raise
        self = cls(directory, store, loaded.tree, restore=restore, apply_budgets=apply_budgets)
        try:
            self.load_reason = loaded.reason
            self.counts["loaded_nodes"] = loaded.nodes
            self.counts["dropped_on_open"] = len(store.dropped_on_open)
            unused = set(store.node_ids()) - {n.cold.checkpoint_id for n in self.tree.nodes.values() if n.cold}
            await asyncio.to_thread(self._delete_now, sorted(unused))  # stale namespaces, writes never recorded
            self.writers = await self._stack.enter_async_context(
                open_writers(store, workers=writers, backlog=backlog))
        except BaseException:
            await self._stack.aclose()
            store.close()
            raise
        return self, self.tree

    async def close(self) -> None:
        """Finish the queued writes (abandoning them if cancelled) and the deletions, save the tree, drop kept
        layers."""
        try:
            await self._stack.aclose()
        finally:
            try:
                if self._save_pending is not None:
                    self._save_pending.cancel()  # saved below anyway
                try:
                    await self._scope.join()  # deletions and file removals: a few unlinks each, never cut
                finally:
                    await self._scope.aclose()
                await asyncio.to_thread(self._save)
            finally:
                for image in list(self._images.values()):
                    await asyncio.to_thread(image.discard)
                self._images.clear()
                self.store.close()

    def _in_thread(self, fn: Callable[..., Any], *args: Any) -> None:
        """``fn(*args)`` in a thread, in the background; ``close`` waits for it."""
        self._scope.start_soon(run_to_end(asyncio.to_thread(fn, *args)))

    # -- writing ----------------------------------------------------------------------------------------------
    def submit(self, node: Node) -> None:
        """Queue ``node`` (it has a hot entry) to be written; never waits (a full backlog leaves it hot only)."""
        if self.writers is None or node.cold is not None or node.digest in self._submitted:
            return
        parent = node.parent
        base = parent.cold.checkpoint_id if parent is not None and parent.cold is not None else None
        parent_image = self._images.get(base) if base is not None else None
        if parent_image is None:
            base = None  # the parent's files are not at hand (not written in this run): written whole
        job = WriteJob(node_id=node.digest, parts=lambda: self._image(node), parent=base,
                       parent_layer=parent_image.layer_upper if parent_image is not None else None,
                       done=lambda outcome: self._written(node, base, outcome))
        if self.writers.submit_nowait(job) == QUEUED:
            self._submitted.add(node.digest)

    async def _image(self, node: Node) -> Prepared:
        """When a writer takes the job: image the node's snapshot and map its files (no copy in the engine)."""
        if node.hot is None:
            raise StoreError(f"{node!r} lost its snapshot before it was written")
        snap: Workspace = node.hot.handle  # type: ignore[assignment]
        image = await snap.image(f"n-{node.digest[:16]}")
        self._images[node.digest] = image
        try:
            parts = await asyncio.to_thread(_map_all, image.files)
        except BaseException:
            await asyncio.to_thread(image.discard)
            self._images.pop(node.digest, None)
            raise
        return Prepared(parts=parts, layer=image.layer_upper)

    def _written(self, node: Node, base: str | None, outcome: Outcome) -> None:
        self._submitted.discard(node.digest)
        image = self._images.get(node.digest)
        if image is not None:  # the files were only needed for this write; the layer stays for the children
            self._in_thread(remove_files, image.files[0].parent, image.files[0].name)
        tree = self.tree
        if not isinstance(outcome, Written) or tree.nodes.get(node.id) is not node or node.dead:
            if not isinstance(outcome, Written):
                self._drop_image(node.digest)
            else:
                self._delete([node.digest])
            return
        delta = base is not None and node.parent is not None and node.parent.cold is not None \
            and node.parent.cold.checkpoint_id == base
        for old in tree.set_cold(node, node.digest, outcome.record.bytes_written, delta=delta):
            if old.checkpoint_id != node.digest:
                self._delete([old.checkpoint_id])
        self._apply_budgets()
        self.save_soon()

    # -- deleting ---------------------------------------------------------------------------------------------
    def delete(self, checkpoint_ids: list[str]) -> None:
        """Checkpoints the tree gave up (evicted): deleted in the background."""
        self._delete(checkpoint_ids)
        self.save_soon()

    def _delete(self, ids: list[str]) -> None:
        for cid in ids:
            self._drop_image(cid)
        self._in_thread(self._delete_now, ids)

    def _delete_now(self, ids: list[str]) -> None:
        for cid in ids:
            with contextlib.suppress(StoreError, KeyError):
                self.store.delete_node(cid)
                self.counts["deleted"] += 1

    def _drop_image(self, cid: str) -> None:
        image = self._images.pop(cid, None)
        if image is not None:
            self._in_thread(image.discard)

    # -- restoring --------------------------------------------------------------------------------------------
    async def restore(self, node: Node, seed: int) -> Workspace | None:
        """A running workspace restored from ``node``'s checkpoint; None when it is unreadable (the node and the
        deltas built on it lose their cold entries: the caller rebuilds by replay)."""
        cold = node.cold
        if cold is None or self._restore is None:
            return None
        started = time.monotonic()
        try:
            ws = await self._restore(node.ns, lambda target: self.store.read_node(cold.checkpoint_id, target), seed)
        except Exception as exc:
            corrupt = exc if isinstance(exc, CorruptEntry) else exc.__cause__
            tree = self.tree
            if isinstance(corrupt, CorruptEntry):  # the store dropped these already; the tree follows
                self.counts["corrupt"] += 1
                for digest in corrupt.dropped:
                    dropped = tree.by_digest.get(digest)
                    if dropped is not None and dropped.cold is not None:
                        for _, entry in tree.drop_cold(dropped):
                            self._delete([entry.checkpoint_id])
            else:
                self.counts["restore_failures"] += 1
            if node.cold is cold:
                for _, entry in tree.drop_cold(node):
                    self._delete([entry.checkpoint_id])
            self.save_soon()
            return None
        self.counts["restores"] += 1
        self.restore_s += 0.3 * (time.monotonic() - started - self.restore_s) if self.restore_s >= 0 else 0.0
        self.tree.touch(node)
        return ws

    @property
    def restore_estimate_s(self) -> float | None:
        """What a restore is expected to take (the rebuild plan's input); None when this run cannot restore."""
        return None if self._restore is None else self.restore_s

    # -- the tree file ----------------------------------------------------------------------------------------
    def save_soon(self) -> None:
        """Save the tree within ``SAVE_EVERY_S`` (one save at a time; the latest state wins)."""
        if self._save_pending is not None:
            return

        async def later() -> None:
            try:
                await asyncio.sleep(max(0.0, self._last_save + SAVE_EVERY_S - time.monotonic()))
            finally:
                self._save_pending = None
            await run_to_end(asyncio.to_thread(self._save))

        self._save_pending = self._scope.start_soon(later())

    def _save(self) -> None:
        self._last_save = time.monotonic()
        try:
            save_tree(self.tree, self.directory / TREE_FILE)
            self.counts["saves"] += 1
        except StoreError:
            self.counts["save_failures"] += 1

    # -- metrics ----------------------------------------------------------------------------------------------
    def statistics(self) -> dict[str, Any]:
        stats: dict[str, Any] = {f"cold_{k}": v for k, v in self.counts.items()}
        if self.writers is not None:
            w = self.writers.statistics()
            stats.update(bytes_written=w.bytes_written, full_bytes=w.full_bytes, writer_backlog=w.queued,
                         writer_in_flight=w.in_flight, writer_bound=w.backlog_bound, writes=w.written,
                         writes_failed=w.failed, writes_dropped=w.dropped, writes_abandoned=w.abandoned)
        stats["disk_bytes"] = self.store.usage_bytes()
        return stats


def _map_all(files: tuple[Path, ...]) -> list[memoryview]:
    """Each image file mapped read-only (tmpfs pages: no copy). The mappings close when the views are dropped."""
    views = []
    for path in files:
        with open(path, "rb") as f:
            size = path.stat().st_size
            views.append(memoryview(mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)) if size else memoryview(b""))
    return views

"""The prefix cache's cold side, for a run with ``--cache-dir DIR``: checkpoints on disk, the tree file, restores.

Owns: the directory (``DIR/store``: the content-addressed ``CheckpointStore``; ``DIR/tree.bin``: the tree, saved
atomically after checkpoints land and when the engine closes, loaded when it starts, so a killed engine's
successor starts from the last save), the background writers that turn a hot node cold (the snapshot is imaged
into the pool's tmpfs when a writer takes the job, its files mapped, chunked and written, then removed; the
image's read-only layer is kept while the node is cold in this run, so its children's checkpoints are written as
deltas on it), deleting evicted checkpoints, and restoring a workspace from a node's checkpoint (a corrupt one is
dropped, with every delta built on it, and the node is rebuilt by replay instead).
Must never: make a fork or a call wait for a disk write, load an unverified checkpoint, or keep an image's files
in memory longer than its write.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bunshin.envs.runtime.image_files import WorkspaceImage, remove_files
from bunshin.envs.workspace import Workspace

from .errors import CorruptEntry, StoreError
from .persist import load_tree, save_tree
from .store import CheckpointStore
from .tree import Node
from .writers import QUEUED, CheckpointWriters, Outcome, Prepared, WriteJob, Written, open_writers

if TYPE_CHECKING:
    from .cache import PrefixCache

TREE_FILE = "tree.bin"
SAVE_EVERY_S = 2.0  # at most one save of the tree file this often while checkpoints land


class ColdStore:
    def __init__(self, cache: PrefixCache, directory: Path, store: CheckpointStore):
        self.cache, self.directory, self.store = cache, directory, store
        self.writers: CheckpointWriters | None = None
        self._stack = contextlib.AsyncExitStack()
        self._images: dict[str, WorkspaceImage] = {}  # checkpoint id -> its image (files gone, layer kept)
        self._submitted: set[str] = set()
        self._save_pending = False
        self._last_save = 0.0
        self.counts: dict[str, int] = dict.fromkeys(
            ("restores", "restore_failures", "corrupt", "deleted", "saves", "save_failures", "loaded_nodes",
             "dropped_on_open"), 0)
        self.load_reason: str | None = None
        self.restore_s = 2.0  # a restore's time, measured (moving average): when a restore pays over a replay

    @classmethod
    async def open(cls, cache: PrefixCache, directory: Path) -> ColdStore:
        """Open (or make) ``directory``; the saved tree replaces the cache's empty one (namespaces of other
        configurations and code versions, and checkpoints the store lost, are dropped)."""
        directory.mkdir(parents=True, exist_ok=True)
        store = await asyncio.to_thread(CheckpointStore, directory / "store")
        self = cls(cache, directory, store)
        try:
            tree = cache.tree
            loaded = await asyncio.to_thread(
                load_tree, directory / TREE_FILE, clock=tree.clock, namespace_ok=set(cache.tasks),
                known_checkpoints=set(store.node_ids()), hot_budget=tree.hot_budget, cold_budget=tree.cold_budget,
                strategy=tree.strategy, admission=tree.admission)
            cache.tree = loaded.tree
            self.load_reason = loaded.reason
            self.counts["loaded_nodes"] = loaded.nodes
            self.counts["dropped_on_open"] = len(store.dropped_on_open)
            unused = set(store.node_ids()) - {n.cold.checkpoint_id for n in cache.tree.nodes.values() if n.cold}
            await asyncio.to_thread(self._delete_now, sorted(unused))  # stale namespaces, writes never recorded
            cache.evict()
            self.writers = await self._stack.enter_async_context(
                open_writers(store, workers=cache.settings.writers, backlog=cache.settings.backlog))
        except BaseException:
            await self._stack.aclose()
            store.close()
            raise
        return self

    async def close(self) -> None:
        """Finish the queued writes (abandoning them if cancelled), save the tree, drop kept layers."""
        try:
            await self._stack.aclose()
        finally:
            try:
                await asyncio.to_thread(self._save)
            finally:
                for image in list(self._images.values()):
                    await asyncio.to_thread(image.discard)
                self._images.clear()
                self.store.close()

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
            self.cache.spawn(asyncio.to_thread(remove_files, image.files[0].parent, image.files[0].name))
        tree = self.cache.tree
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
        self.cache.evict()
        self.save_soon()

    # -- deleting ---------------------------------------------------------------------------------------------
    def delete(self, checkpoint_ids: list[str]) -> None:
        """Checkpoints the tree gave up (evicted): deleted in the background."""
        self._delete(checkpoint_ids)
        self.save_soon()

    def _delete(self, ids: list[str]) -> None:
        for cid in ids:
            self._drop_image(cid)
        self.cache.spawn(asyncio.to_thread(self._delete_now, ids))

    def _delete_now(self, ids: list[str]) -> None:
        for cid in ids:
            with contextlib.suppress(StoreError, KeyError):
                self.store.delete_node(cid)
                self.counts["deleted"] += 1

    def _drop_image(self, cid: str) -> None:
        image = self._images.pop(cid, None)
        if image is not None:
            self.cache.spawn(asyncio.to_thread(image.discard))

    # -- restoring --------------------------------------------------------------------------------------------
    async def restore(self, node: Node, seed: int) -> Workspace | None:
        """A running workspace restored from ``node``'s checkpoint; None when it is unreadable (the node and the
        deltas built on it lose their cold entries: the caller rebuilds by replay)."""
        cold = node.cold
        if cold is None:
            return None
        task = self.cache.tasks[node.ns]
        if self.cache.runtime_restore is None:
            return None
        started = time.monotonic()
        try:
            ws = await self.cache.runtime_restore(self.cache.suite.app(task), None,
                                                  lambda target: self.store.read_node(cold.checkpoint_id, target),
                                                  seed=seed)
        except Exception as exc:
            corrupt = exc if isinstance(exc, CorruptEntry) else exc.__cause__
            tree = self.cache.tree
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
        self.cache.tree.touch(node)
        return ws

    # -- the tree file ----------------------------------------------------------------------------------------
    def save_soon(self) -> None:
        """Save the tree within ``SAVE_EVERY_S`` (one save at a time; the latest state wins)."""
        if self._save_pending:
            return
        self._save_pending = True

        async def later() -> None:
            try:
                await asyncio.sleep(max(0.0, self._last_save + SAVE_EVERY_S - time.monotonic()))
            finally:
                self._save_pending = False
            await asyncio.to_thread(self._save)

        self.cache.spawn(later())

    def _save(self) -> None:
        self._last_save = time.monotonic()
        try:
            save_tree(self.cache.tree, self.directory / TREE_FILE)
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

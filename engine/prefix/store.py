"""Cold checkpoints of prefix-tree nodes: a durable, content-addressed store of deltas under one directory.

Owns: the directory's layout (``chunks/xx/<blake2b>`` content-addressed chunks, ``nodes/<id>`` manifests,
``tmp/`` temporary files, ``LOCK``), writing a node (its state parts as chunks, the files of its layer that differ
from its parent's, a manifest naming both and the parent), reading one back (parts, and the file tree of the whole
parent chain materialised into a directory), deleting one (its children are rebased onto its parent, chunks are
reference-counted), and recovering on open (temporary files removed, corrupt manifests and orphan chunks dropped).
A write is ``plan_node`` (hashing and the layer diff, no writes: pure enough to run in a thread) then placing each
file atomically (temp name, fsync, rename, directory fsync; chunks first, the manifest last), then ``finish``; the
async writers (``writers.py``) place the same plan's files with aiofiles. A layer file is unchanged when its
metadata, size, mtime and ctime match the parent snapshot's, and, when the parent changed it within ``RACY_NS`` of
its last change, its bytes too. Fixed-size chunks, not content-defined: application buffers change in place, so
offsets are stable, and blake2b runs at ~790 MB/s where a Python rolling hash runs at ~6 MB/s (measured here);
each state part is chunked on its own, so a part that grows shifts no other.
Must never: return bytes it could not verify (a chunk's blake2b is its name and its trailer), leave a file that
looks complete but is not, or leave a manifest visible whose chunks are not durable. Errors name the file.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from bunshin.envs.framing import Checksum, Format, FramingError, fsync_dir

from .errors import CorruptEntry, StoreBusy, StoreError, StoreFull, StoreWriteFailed, UnknownNode
from .layer_delta import Entry, diff_layer, remove_path, set_meta, under

CHUNK_MAGIC, NODE_MAGIC, VERSION = b"BUNSHCHK", b"BUNSHNOD", 1
# frames of ``bunshin.envs.framing``: a chunk's trailer is the blake2b-256 of its payload, which is also its name; a
# manifest's is the CRC-32 of its body
CHUNK = Format("checkpoint chunk", CHUNK_MAGIC, VERSION, Checksum.BLAKE2B_256, max_body=1 << 32)
MANIFEST = Format("checkpoint manifest", NODE_MAGIC, VERSION, Checksum.CRC32, max_body=1 << 32)
CHUNK_BYTES = 1 << 20
_SAFE = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
Buffer = bytes | bytearray | memoryview


class Part(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    length: int
    chunks: list[str]


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    parent: str | None
    parts: list[Part]
    changed: list[Entry]  # added or changed since the parent (all files if no parent)
    deleted: list[str]  # removed since the parent (applied before ``changed``)
    full_bytes: int


class NodeRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What writing a node cost: ``bytes_written`` (new chunks and the manifest) against ``full_bytes`` (a full
    checkpoint: every state byte and every file of the layer)."""

    node_id: str
    parent: str | None
    bytes_written: int
    full_bytes: int
    state_bytes: int
    chunks_written: int
    chunks_reused: int
    files_changed: int
    files_deleted: int


_encode, _decode = msgspec.msgpack.Encoder().encode, msgspec.msgpack.Decoder(Manifest).decode


@dataclass(eq=False)
class Pending:
    """One file a plan places: ``cid`` is a chunk's id, None for the manifest."""

    final: Path
    blobs: Sequence[Buffer]
    cid: str | None = None

    @property
    def size(self) -> int:
        return sum(memoryview(b).nbytes for b in self.blobs)


@dataclass(eq=False)
class Plan:
    manifest: Manifest
    chunks: list[Pending]
    manifest_file: Pending
    pins: set[str]
    stats: dict[str, int]
    temps: list[Path] = field(default_factory=list)
    placed: list[str] = field(default_factory=list)


def _ids(m: Manifest) -> set[str]:
    return {c for p in m.parts for c in p.chunks} | {c for e in m.changed for c in e.chunks}


def merge(base: Manifest, top: Manifest) -> tuple[list[Entry], list[str]]:
    """The delta of applying ``base``'s then ``top``'s, relative to ``base``'s parent."""
    gone = set(top.deleted)
    changed = {e.path: e for e in base.changed if not under(e.path, gone)}
    changed.update((e.path, e) for e in top.changed)
    return sorted(changed.values(), key=lambda e: e.path.split("/")), sorted(set(base.deleted) | gone)


class CheckpointStore:
    """The store under ``root``; one process at a time (``LOCK``). Thread-safe: plans run in threads."""

    def __init__(self, root: Path, *, chunk_bytes: int = CHUNK_BYTES, fault: Callable[[str], None] | None = None):
        self.root, self.chunk_bytes, self.fault = Path(root), chunk_bytes, fault or (lambda step: None)
        self.chunks, self.nodes, self.tmp = self.root / "chunks", self.root / "nodes", self.root / "tmp"
        for d in (self.chunks, self.nodes, self.tmp, *(self.chunks / f"{i:02x}" for i in range(256))):
            d.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.root / "LOCK", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(self._lock_fd)
            raise StoreBusy(f"{self.root} is in use by another process") from exc
        self._mutex = threading.RLock()
        self._manifests: dict[str, Manifest] = {}
        self._refs: Counter[str] = Counter()
        self._pins: Counter[str] = Counter()
        self._present: dict[str, int] = {}  # chunk id -> file size
        self._manifest_bytes: dict[str, int] = {}
        self.dropped_on_open: list[CorruptEntry] = []
        self._recover()

    # -- open / close -------------------------------------------------------------------------------------------

    def _recover(self) -> None:
        for leftover in self.tmp.iterdir():
            leftover.unlink()
        for path in sorted(self.nodes.iterdir()):
            try:
                manifest = self._load_manifest(path)
            except CorruptEntry as exc:
                path.unlink()
                self.dropped_on_open.append(CorruptEntry(path, exc.reason, [path.name]))
                continue
            self._manifests[manifest.node_id] = manifest
            self._manifest_bytes[manifest.node_id] = path.stat().st_size
        for node_id in [n for n, m in self._manifests.items() if m.parent and m.parent not in self._manifests]:
            if node_id in self._manifests:  # orphans: their parent's manifest was corrupt
                dropped = self._drop_subtree(node_id)
                self.dropped_on_open.append(CorruptEntry(self.nodes / node_id, "parent missing", dropped))
        for m in self._manifests.values():
            self._refs.update(_ids(m))
        for fan in self.chunks.iterdir():
            for chunk in fan.iterdir():
                self._present[chunk.name] = chunk.stat().st_size
        self.gc()
        fsync_dir(self.nodes)

    def close(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> CheckpointStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- queries -------------------------------------------------------------------------------------------------

    def has(self, node_id: str) -> bool:
        return node_id in self._manifests

    def node_ids(self) -> list[str]:
        return sorted(self._manifests)

    def manifest(self, node_id: str) -> Manifest:
        try:
            return self._manifests[node_id]
        except KeyError:
            raise UnknownNode(node_id) from None

    def usage_bytes(self) -> int:
        with self._mutex:
            return sum(self._present.values()) + sum(self._manifest_bytes.values())

    # -- writing -------------------------------------------------------------------------------------------------

    def write_node(self, node_id: str, parts: Sequence[Buffer], layer: Path | None = None, *,
                   parent: str | None = None, parent_layer: Path | None = None) -> NodeRecord:
        """Write node ``node_id``: its state ``parts`` and the files of ``layer`` that differ from ``parent_layer``
        (``parent``'s files, which must be in the store). Raises ``StoreFull``/``StoreWriteFailed`` with nothing
        of this write left visible."""
        return self._commit(self.plan_node(node_id, parts, layer, parent=parent, parent_layer=parent_layer))

    def _commit(self, plan: Plan) -> NodeRecord:
        """Place the plan's chunks, fsync their directories, place the manifest, register it; on any failure undo
        exactly what was done."""
        try:
            for pending in plan.chunks:
                self.place(plan, pending)
            for directory in {p.final.parent for p in plan.chunks}:
                fsync_dir(directory)
            self.place(plan, plan.manifest_file)
            fsync_dir(self.nodes)
        except OSError as exc:
            self.abort(plan)
            raise self.translate(exc, plan) from exc
        except BaseException:
            self.abort(plan)
            raise
        return self.finish(plan)

    def plan_node(self, node_id: str, parts: Sequence[Buffer], layer: Path | None = None, *,
                  parent: str | None = None, parent_layer: Path | None = None) -> Plan:
        """Hash the state and diff the layer; pin every chunk the node needs. Writes nothing."""
        if not node_id or len(node_id) > 200 or not set(node_id) <= _SAFE or node_id.startswith("."):
            raise StoreError(f"bad node id {node_id!r}")
        if parent is not None and parent not in self._manifests:
            raise UnknownNode(parent)
        if parent is not None and layer is not None and parent_layer is None:
            raise StoreError(f"node {node_id}: a delta on {parent} needs the parent's layer to compare with")
        new: dict[str, Pending] = {}
        pins: set[str] = set()
        stats = Counter[str]()

        def chunk(view: memoryview) -> str:
            cid = CHUNK.checksum.digest([view]).hex()
            with self._mutex:  # pinned as it is seen, so no delete or gc removes a chunk this plan reuses
                if cid not in pins:
                    pins.add(cid)
                    self._pins[cid] += 1
                absent = cid not in self._present and cid not in new
            if absent:
                new[cid] = Pending(self._chunk_path(cid), CHUNK.frame([view], digest=bytes.fromhex(cid)), cid)
            stats["chunks_written" if absent else "chunks_reused"] += 1
            return cid

        state: list[Part] = []
        try:
            for part in parts:
                view = memoryview(part).cast("B")
                ids = [chunk(view[at:at + self.chunk_bytes]) for at in range(0, view.nbytes, self.chunk_bytes)]
                state.append(Part(length=view.nbytes, chunks=ids))
                stats["state_bytes"] += view.nbytes
            changed, deleted, file_bytes = ([], [], 0) if layer is None else diff_layer(
                Path(layer), None if parent_layer is None else Path(parent_layer), self.chunk_bytes, chunk)
        except BaseException:
            with self._mutex:
                self._pins.subtract(pins)
            raise
        manifest = Manifest(node_id=node_id, parent=parent, parts=state, changed=changed, deleted=deleted,
                            full_bytes=stats["state_bytes"] + file_bytes)
        return self._plan(manifest, list(new.values()), pins, dict(stats))

    def _plan(self, manifest: Manifest, chunks: list[Pending], pins: set[str], stats: dict[str, int]) -> Plan:
        blobs = MANIFEST.frame([_encode(manifest)])
        return Plan(manifest, chunks, Pending(self.nodes / manifest.node_id, blobs), pins, stats)

    def new_temp(self, plan: Plan) -> Path:
        path = self.tmp / f"{secrets.token_hex(8)}.tmp"
        plan.temps.append(path)
        return path

    def place(self, plan: Plan, pending: Pending) -> None:
        """Write ``pending`` under a temporary name, fsync it, rename it into place."""
        tmp = self.new_temp(plan)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            for blob in pending.blobs:
                view = memoryview(blob).cast("B")
                while view:
                    view = view[os.write(fd, view):]
            self.fault("chunk.written" if pending.cid else "manifest.written")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, pending.final)
        self.placed(plan, pending, tmp)

    def placed(self, plan: Plan, pending: Pending, tmp: Path) -> None:
        """``tmp`` was renamed to ``pending``'s final name (its directory is fsynced later)."""
        plan.temps.remove(tmp)
        if pending.cid is not None:
            with self._mutex:
                plan.placed.append(pending.cid)
                self._present.setdefault(pending.cid, pending.size)
        self.fault("chunk.placed" if pending.cid else "manifest.placed")

    def finish(self, plan: Plan) -> NodeRecord:
        """Register a plan whose files are all in place and durable; returns what it cost."""
        m = plan.manifest
        with self._mutex:
            old = self._manifests.get(m.node_id)
            self._manifests[m.node_id] = m
            self._manifest_bytes[m.node_id] = plan.manifest_file.size
            self._refs.update(plan.pins)
            self._pins.subtract(plan.pins)
            if old is not None:
                self._release(_ids(old))
        written = sum(p.size for p in plan.chunks) + plan.manifest_file.size
        counts = {k: plan.stats.get(k, 0) for k in ("state_bytes", "chunks_written", "chunks_reused")}
        return NodeRecord(node_id=m.node_id, parent=m.parent, bytes_written=written, full_bytes=m.full_bytes,
                          files_changed=len(m.changed), files_deleted=len(m.deleted), **counts)

    def abort(self, plan: Plan) -> None:
        """Undo an unfinished plan: its temporary files, its manifest if placed, the chunks only it placed."""
        for tmp in plan.temps:
            tmp.unlink(missing_ok=True)
        plan.temps.clear()
        with self._mutex:
            if plan.manifest.node_id not in self._manifests:
                plan.manifest_file.final.unlink(missing_ok=True)
            self._pins.subtract(plan.pins)
            plan.pins.clear()
            self._sweep(plan.placed)

    def translate(self, exc: OSError, plan: Plan) -> StoreError:
        """The typed error for an OSError met while writing ``plan`` (raise it ``from exc``)."""
        what = f"{self.root}: writing node {plan.manifest.node_id}"
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return StoreFull(f"{what}: no space left")
        return StoreWriteFailed(f"{what}: {exc}")

    # -- reading -------------------------------------------------------------------------------------------------

    def read_node(self, node_id: str, target: Path | None = None, *,
                  from_ancestor: str | None = None) -> list[bytearray]:
        """The node's state parts; with ``target``, its layer's files written there: the whole chain into an empty
        directory, or only the deltas below ``from_ancestor`` onto a directory holding that ancestor's files.
        On ``CorruptEntry`` the target's contents are undefined (discard them)."""
        chain = [self.manifest(node_id)]
        while chain[-1].parent is not None and chain[-1].parent != from_ancestor:
            chain.append(self.manifest(chain[-1].parent))
        if from_ancestor is not None and chain[-1].parent != from_ancestor:
            raise StoreError(f"node {from_ancestor!r} is not an ancestor of {node_id!r}")
        parts = []
        for part in chain[0].parts:
            buf = bytearray(part.length)
            view = memoryview(buf)
            for at, cid in zip(range(0, part.length, self.chunk_bytes), part.chunks, strict=True):
                self._read_chunk(cid, view[at:at + self.chunk_bytes])
            parts.append(buf)
        if target is not None:
            changed, deleted = list(chain[-1].changed), list(chain[-1].deleted)
            for m in reversed(chain[:-1]):
                changed, deleted = merge(Manifest(node_id="", parent=None, parts=[], changed=changed, deleted=deleted,
                                                  full_bytes=0), m)
            self._materialise(Path(target), changed, deleted if from_ancestor is not None else [])
        return parts

    def _read_chunk(self, cid: str, into: memoryview) -> None:
        path = self._chunk_path(cid)
        try:
            CHUNK.read_into(path, into, digest=bytes.fromhex(cid))
            return
        except FileNotFoundError:
            reason = "missing"
        except FramingError as exc:
            reason = exc.reason
        with self._mutex:
            users = [n for n, m in self._manifests.items() if cid in _ids(m)]
            dropped = [d for n in users if n in self._manifests for d in self._drop_subtree(n)]
            path.unlink(missing_ok=True)
            self._present.pop(cid, None)
        raise CorruptEntry(path, reason, dropped)

    def _load_manifest(self, path: Path) -> Manifest:
        try:
            body = MANIFEST.read(path)
        except FramingError as exc:
            raise CorruptEntry(path, exc.reason) from exc
        try:
            manifest = _decode(body)
        except msgspec.DecodeError as exc:
            raise CorruptEntry(path, f"undecodable body: {exc}") from exc
        if manifest.node_id != path.name:
            raise CorruptEntry(path, f"holds node {manifest.node_id!r}")
        return manifest

    def _materialise(self, target: Path, changed: list[Entry], deleted: list[str]) -> None:
        target.mkdir(parents=True, exist_ok=True)
        for rel in deleted:
            remove_path(target / rel)
        buf = bytearray(self.chunk_bytes)
        for e in changed:
            path = target / e.path
            if e.kind == "dir":
                if not path.is_dir() or path.is_symlink():
                    remove_path(path)
                    path.mkdir()
            else:
                remove_path(path)
                if e.kind == "symlink":
                    os.symlink(e.target, path)
                elif e.kind == "whiteout":
                    os.mknod(path, 0o020000 | e.mode, os.makedev(0, 0))
                else:
                    with open(path, "wb") as f:
                        f.write(e.inline)
                        for at, cid in zip(range(0, e.size if e.chunks else 0, self.chunk_bytes), e.chunks,
                                           strict=True):
                            view = memoryview(buf)[:min(self.chunk_bytes, e.size - at)]
                            self._read_chunk(cid, view)
                            f.write(view)
            set_meta(path, e)
        for e in reversed(changed):  # writing into a directory changes its mtime: set dirs' last
            if e.kind == "dir":
                os.utime(target / e.path, ns=(e.mtime_ns, e.mtime_ns), follow_symlinks=False)

    # -- deleting ------------------------------------------------------------------------------------------------

    def delete_node(self, node_id: str) -> None:
        """Remove a node; each child is first rebased onto its parent (the child's manifest absorbs its delta)."""
        with self._mutex:
            gone = self.manifest(node_id)
            for child in [m for m in self._manifests.values() if m.parent == node_id]:
                changed, deleted = merge(gone, child)
                rebased = msgspec.structs.replace(child, parent=gone.parent, changed=changed, deleted=deleted)
                self._pins.update(_ids(rebased))
                self._commit(self._plan(rebased, [], _ids(rebased), {}))
            self._forget(node_id)
            fsync_dir(self.nodes)

    def _forget(self, node_id: str) -> None:
        m = self._manifests.pop(node_id)
        self._manifest_bytes.pop(node_id, None)
        (self.nodes / node_id).unlink(missing_ok=True)
        self._release(_ids(m))

    def _drop_subtree(self, node_id: str) -> list[str]:
        dropped, todo = [], [node_id]
        while todo:
            n = todo.pop()
            todo += [c for c, m in self._manifests.items() if m.parent == n]
            self._forget(n)
            dropped.append(n)
        return dropped

    def _release(self, ids: Iterable[str]) -> None:
        """Drop one reference to each chunk; a chunk nobody references or pins is removed."""
        ids = list(ids)
        self._refs.subtract(ids)
        self._sweep(ids)

    def _sweep(self, ids: Iterable[str]) -> None:
        for cid in ids:
            if self._refs[cid] <= 0 and self._pins[cid] <= 0:
                self._refs.pop(cid, None)
                self._pins.pop(cid, None)
                if self._present.pop(cid, None) is not None:
                    self._chunk_path(cid).unlink(missing_ok=True)

    def gc(self) -> int:
        """Remove chunks no manifest references and no write in progress pins; returns how many."""
        with self._mutex:
            orphans = [c for c in self._present if self._refs[c] <= 0 and self._pins[c] <= 0]
            for cid in orphans:
                self._chunk_path(cid).unlink(missing_ok=True)
                del self._present[cid]
            self._refs += Counter()  # drop zero counts
            return len(orphans)

    def _chunk_path(self, cid: str) -> Path:
        return self.chunks / cid[:2] / cid

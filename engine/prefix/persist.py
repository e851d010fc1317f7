"""The prefix tree across runs: one file under ``--cache-dir`` so that epoch 2, or tomorrow's run, starts warm.

A tree file is a frame of ``bunshin.envs.framing`` (magic ``BUNSHTRE``, format version 1, body length, body,
CRC-32 of the body) whose body is MessagePack (``TreeFile``: per namespace its nodes in preorder, each with its
parent's index, its call in canonical form, its observation, tool-seconds, hits, age, non-cacheable flag, digest,
cold entry, GreedyDual inflation and unadmitted issue counts). Hot entries and pins are this run's and are not
saved: a loaded node is COLD if it had a cold entry, else ABSENT. The tree's own counters (hits, misses, admitted,
...) are per run and start at zero; a node's ``hits`` and recency carry over (recency as an age against the saving
tree's clock, to the microsecond, so LRU order survives a clock that restarts). Saved issues come back as that many
anonymous issuers: yesterday's issue counts as an earlier epoch's.
Owns: the file's format, ``save_tree`` (temp name, fsync, rename, directory fsync; an older file stays whole until
the rename) and ``load_tree`` (all or nothing; drops the namespaces the caller says are stale and the cold entries
whose checkpoint the store no longer has).
Must never: return a partial tree from a bad file, raise out of ``load_tree`` for anything a file holds, save a
hot entry or a pin, or leave a file under the final name that is not complete and fsynced.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from bunshin.envs.framing import Checksum, Format, FramingError
from bunshin.envs.records import Observation, ToolCall, canonical

from .errors import CorruptTreeFile, StoreFull, StoreWriteFailed, TreeMisuse
from .eviction import EvictionStrategy
from .node import Kind, Namespace, Node
from .tree import ISSUERS_KEPT, Admission, PrefixTree

MAGIC, VERSION = b"BUNSHTRE", 1
FORMAT = Format("prefix tree file", MAGIC, VERSION, Checksum.CRC32, max_body=1 << 32)
_AGE_DIGITS = 6  # ages are kept to the microsecond: save(load(save(t))) == save(t) byte for byte


class SavedCold(msgspec.Struct, frozen=True, array_like=True):
    checkpoint_id: str
    nbytes: int
    delta: bool


class SavedNode(msgspec.Struct, frozen=True, array_like=True):
    parent: int  # index in its namespace's list (always lower); -1 at the root, which is index 0
    key: bytes  # canonical(call); b"" at the root
    obs_kind: int  # 1: an ``Observation``; 0: any other value, which comes back in its MessagePack form
    observation: msgspec.Raw
    tool_s: float
    hits: int
    age_s: float  # the saving tree's clock minus the node's last use
    non_cacheable: bool
    digest: str
    cold: SavedCold | None
    inflation: dict[str, float]
    issues: list[tuple[bytes, int]]


class SavedNamespace(msgspec.Struct, frozen=True, array_like=True):
    ns: Namespace
    nodes: list[SavedNode]


class TreeFile(msgspec.Struct, frozen=True, kw_only=True):
    inflation: dict[str, float]
    namespaces: list[SavedNamespace]


_encode = msgspec.msgpack.Encoder().encode
_decode_file = msgspec.msgpack.Decoder(TreeFile).decode
_decode_any, _decode_obs = msgspec.msgpack.Decoder().decode, msgspec.msgpack.Decoder(Observation).decode


@dataclass(frozen=True)
class Saved:
    path: Path
    nodes: int
    skipped: int  # nodes left out with their subtrees: an observation MessagePack cannot encode
    nbytes: int


@dataclass
class Loaded:
    """``reason``: why the file was not used (the tree is then empty); None when it loaded or did not exist.
    ``stale_checkpoints``: cold entries of dropped namespaces (the engine deletes them from the store).
    ``absent``: digests of nodes whose checkpoint the store no longer has, or whose delta base is gone."""

    tree: PrefixTree
    reason: str | None = None
    nodes: int = 0
    dropped_namespaces: list[Namespace] = field(default_factory=list)
    stale_checkpoints: list[str] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)


def _records(tree: PrefixTree) -> tuple[TreeFile, int, int]:
    now, spaces, kept, skipped = tree.clock(), [], 0, 0
    for ns, root in tree.roots.items():
        index: dict[int, int] = {}
        out: list[SavedNode] = []
        stack: list[Node] = [root]
        while stack:
            n = stack.pop()
            stack.extend(reversed(n.children.values()))
            parent = -1 if n.parent is None else index.get(n.parent.id)
            try:
                raw = None if parent is None else msgspec.Raw(_encode(n.observation))  # None: below a node left out
            except (TypeError, ValueError, OverflowError):
                raw = None
            if parent is None or raw is None:
                skipped += 1
                continue
            index[n.id] = len(out)
            cold = None if n.cold is None else SavedCold(n.cold.checkpoint_id, n.cold.nbytes, n.cold.delta)
            out.append(SavedNode(
                parent, n.key, int(isinstance(n.observation, Observation)), raw, n.tool_s, n.hits,
                round(now - n.last_used, _AGE_DIGITS), n.non_cacheable, n.digest, cold,
                {k.value: v for k, v in n.inflation.items()}, [(k, len(s)) for k, s in n.issues.items()]))
        if out:
            spaces.append(SavedNamespace(ns, out))
            kept += len(out)
    return TreeFile(inflation={k.value: v for k, v in tree.inflation.items()}, namespaces=spaces), kept, skipped


def save_tree(tree: PrefixTree, path: Path | str, *, fault: Callable[[str], None] | None = None) -> Saved:
    """Write ``tree`` to ``path`` atomically. Raises ``StoreFull`` / ``StoreWriteFailed`` (the previous file, if
    any, untouched; no temporary file left). ``fault``: a test hook called at ``"tree.written"``."""
    path = Path(path)
    body_file, kept, skipped = _records(tree)
    try:
        written = FORMAT.write_file(path, [_encode(body_file)],
                                    fault=None if fault is None else (lambda: fault("tree.written")))
    except OSError as exc:
        kind = StoreFull if exc.errno in (errno.ENOSPC, errno.EDQUOT) else StoreWriteFailed
        raise kind(f"saving the prefix tree to {path}: {exc}") from exc
    return Saved(path, kept, skipped, written)


def load_tree(path: Path | str, *, clock: Callable[[], float],
              namespace_ok: Callable[[Namespace], bool] | Collection[Namespace] | None = None,
              known_checkpoints: Collection[str] | None = None, hot_budget: int | None = None,
              cold_budget: int | None = None, strategy: EvictionStrategy | None = None,
              admission: Admission | None = None) -> Loaded:
    """The tree saved at ``path``, or an empty one (missing file; or a bad one, with ``reason``). ``namespace_ok``:
    which namespaces are current (a predicate or a collection; None keeps all); the others are dropped.
    ``known_checkpoints``: the ids the store holds (None: trust the file); a cold entry whose checkpoint is not
    among them, or whose delta base was dropped, becomes absent. Over ``cold_budget``, call ``evict()``."""
    def fresh() -> PrefixTree:
        return PrefixTree(hot_budget=hot_budget, cold_budget=cold_budget, clock=clock, strategy=strategy,
                          admission=admission)

    try:
        body = FORMAT.read(path)
    except FileNotFoundError:
        return Loaded(fresh())
    except FramingError as exc:
        return Loaded(fresh(), reason=f"{path}: {exc.reason}; starting with an empty tree")
    except OSError as exc:
        return Loaded(fresh(), reason=f"unreadable: {exc}")
    ok: Callable[[Namespace], bool] = (
        (lambda ns: True) if namespace_ok is None else namespace_ok if callable(namespace_ok)
        else frozenset(namespace_ok).__contains__)
    loaded = Loaded(fresh())
    try:
        _build(loaded, _decode_file(body), ok, known_checkpoints)
        loaded.tree.check()
    except (ValueError, CorruptTreeFile, TreeMisuse, AssertionError) as exc:  # msgspec's DecodeError is a ValueError
        return Loaded(fresh(), reason=f"{path}: {exc or type(exc).__name__}; starting with an empty tree")
    return loaded


def _build(loaded: Loaded, file: TreeFile, ok: Callable[[Namespace], bool], known: Collection[str] | None) -> None:
    tree, now = loaded.tree, loaded.tree.clock()
    tree.inflation.update({Kind(k): v for k, v in file.inflation.items()})
    for space in file.namespaces:
        if not ok(space.ns):
            loaded.dropped_namespaces.append(space.ns)
            loaded.stale_checkpoints += [r.cold.checkpoint_id for r in space.nodes if r.cold is not None]
            continue
        if space.ns in tree.roots or not space.nodes:
            raise CorruptTreeFile(f"namespace {space.ns} twice or without a root")
        nodes: list[Node] = []
        for i, r in enumerate(space.nodes):
            if r.obs_kind not in (0, 1):
                raise CorruptTreeFile(f"node {i}: unknown observation kind {r.obs_kind}")
            obs = (_decode_obs if r.obs_kind else _decode_any)(r.observation)
            if i == 0:
                if r.parent != -1 or r.key:
                    raise CorruptTreeFile("a namespace's first node is not its root")
                node = tree.root(space.ns, obs)
            else:
                if not 0 <= r.parent < i:
                    raise CorruptTreeFile(f"node {i} names parent {r.parent}")
                parent, call = nodes[r.parent], msgspec.json.decode(r.key, type=ToolCall)
                if canonical(call) != r.key or r.key in parent.children:
                    raise CorruptTreeFile(f"node {i}: a call not in canonical form, or twice under its parent")
                node = tree.restore(parent, call, obs, r.tool_s)  # its flags are set once its subtree is in
            if node.digest != r.digest:
                raise CorruptTreeFile(f"node {i}: digest {r.digest} but its path gives {node.digest}")
            node.hits, node.last_used = r.hits, now - r.age_s
            if r.cold is not None:
                gone = known is not None and r.cold.checkpoint_id not in known
                if gone or (r.cold.delta and (node.parent is None or node.parent.cold is None)):
                    loaded.absent.append(node.digest)
                else:
                    tree.set_cold(node, r.cold.checkpoint_id, r.cold.nbytes, delta=r.cold.delta)
            node.inflation = {Kind(k): v for k, v in r.inflation.items()}
            nodes.append(node)
        for node, r in zip(nodes, space.nodes, strict=True):
            node.non_cacheable = r.non_cacheable
            node.issues = {key: {object() for _ in range(min(n, ISSUERS_KEPT))} for key, n in r.issues}
        loaded.nodes += len(nodes)


"""The Spec Tool Selector: predicts a sample's next canonical tool calls (top k, with probabilities) from what the
engine has seen, learning from recorded trajectories as they finish.

Owns: the examples (``learn``...), their spool file, the background retrain, prediction, and the model file in the
run's model directory (``spec-selector.bin``).
The model (measured with ``bunshin bench selector``, see ``docs``/BENCHMARKS.md): scikit-learn's
``KNeighborsClassifier`` (cosine distance, brute force) on hashed features (``features.py``). The grounded policy is
deterministic given what it saw, so a situation seen before is best answered by what was done there: an exact match
(distance 0) votes alone, and the vote's shares are the probabilities (a state where the policy detours 15% of the
time answers its usual call with p ~ 0.85); otherwise the ``NEIGHBOURS`` nearest vote weighted by 1/distance and the
shares are scaled by the nearest one's cosine similarity, so an unfamiliar situation gets low probabilities.
Fitting is cheap (it stores the matrix); featurizing dominates, and both run in a worker process.

Processes: a ``ProcessPoolExecutor`` of ``WORKERS`` processes started with ``spawn`` (the engine has threads: it is
never forked) runs ``_fit`` (read the spool, featurize what is new, fit, write the model file) and ``_predict``
(featurize one situation, ask the model, which each worker loads once per model file). With two workers a
prediction never waits behind a retrain. The event loop's thread only encodes an example (microseconds) and awaits
futures; the spool is appended from a thread.
Files: a temporary directory per open selector holds the spool (length-prefixed MessagePack ``Example`` records)
and the model files; ``close`` saves examples and model into ``model_dir/spec-selector.bin`` (a frame of
``bunshin.envs.framing``: magic, format version 2, length, CRC-32; its body the length of a JSON header with the
namespace, the header, the spool, the pickled model; written atomically) and removes the directory. ``open`` takes
a saved file only if the frame verifies and the namespace matches (and the model only if scikit-learn's version and
the feature groups match; else its examples are retrained). Format 1 was framed otherwise (no length, the version
in the JSON header); such a file is refused like any other it cannot read.
Must never: block the event loop on featurizing, fitting or predicting; import scikit-learn in the engine's
process (a second or more, for the version a saved file records: that is read from the package's metadata); fork
the engine process; leave a worker process behind after ``close`` (also when cancelled); raise at ``open`` over a
bad saved file (it starts empty and says why); or see a task's reference solution or evaluator (it learns only
``Situation``s and the calls made).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import importlib.metadata
import logging
import mmap
import multiprocessing
import os
import pickle
import shutil
import struct
import tempfile
import time
import warnings
from collections.abc import Sequence
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import msgspec

from bunshin.envs.framing import Checksum, Format, FramingError
from bunshin.envs.records import ToolCall
from bunshin.envs.runtime.task_scope import TaskScope, run_to_end

from ..errors import EngineError
from ..records import Trajectory
from .features import FEATURE_GROUPS, Situation, examples_of, featurize

log = logging.getLogger(__name__)

MAGIC = b"BSPECSEL"
FORMAT = 2
SAVED = Format("spec selector file", MAGIC, FORMAT, Checksum.CRC32, max_body=1 << 36)
FILE_NAME = "spec-selector.bin"
NEIGHBOURS = 15
WORKERS = 2  # one may fit while the other predicts
MAX_LABEL = 4096  # a call longer than this (a huge typed text) is not worth predicting: not learned
EXACT = 1e-9  # cosine distance under which two situations count as the same
MAX_EXACT = 1024  # exact matches that vote at most


class SelectorError(EngineError):
    """The root of the selector's errors."""


class TrainFileError(SelectorError):
    """A ``--spec-train`` file cannot be read or holds a line that is not a trajectory; names the file and line."""

    def __init__(self, path: Path, line: int | None, reason: str):
        self.path, self.line, self.reason = path, line, reason
        super().__init__(f"{path}{f':{line}' if line else ''}: {reason}")


class Prediction(msgspec.Struct, frozen=True):
    label: str  # the call's canonical form
    call: ToolCall
    p: float


class Example(msgspec.Struct, frozen=True, array_like=True):
    situation: Situation
    label: str


_example_encoder = msgspec.msgpack.Encoder()
_example_decoder = msgspec.msgpack.Decoder(Example)
_situation_decoder = msgspec.msgpack.Decoder(Situation)
_trajectory_decoder = msgspec.json.Decoder(Trajectory)
_call_decoder = msgspec.json.Decoder(ToolCall)
_LEN = struct.Struct("<I")


def record(situation: Situation, label: str) -> bytes:
    """One spool record: a length, then the MessagePack ``Example``."""
    body = _example_encoder.encode(Example(situation.bounded(), label))
    return _LEN.pack(len(body)) + body


# -- the worker's side (runs in the pool's processes) ------------------------------------------------------------
class _Rows:
    """What a worker featurized of a spool so far (a retrain featurizes only the new examples)."""

    def __init__(self) -> None:
        self.offset = 0
        self.blocks: list[Any] = []
        self.labels: list[str] = []


_ROWS: dict[tuple[str, tuple[str, ...]], _Rows] = {}
_MODEL: dict[str, Any] = {}  # model file -> the loaded model (one at a time)


def _worker_init() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    with contextlib.suppress(OSError):
        os.nice(5)  # training yields to the engine and the workspaces


def read_spool(path: str, offset: int, count: int) -> tuple[list[Example], int]:
    """Up to ``count`` examples from byte ``offset``; and the offset after them."""
    out: list[Example] = []
    with open(path, "rb") as f:
        f.seek(offset)
        while len(out) < count:
            head = f.read(_LEN.size)
            if len(head) < _LEN.size:
                break
            (n,) = _LEN.unpack(head)
            out.append(_example_decoder.decode(f.read(n)))
            offset += _LEN.size + n
    return out, offset


def fit_model(examples: Sequence[Example] | None, groups: Sequence[str], *, rows: _Rows | None = None) -> dict:
    """The fitted model (a dict: ``knn``, ``classes``, ``y``, ``groups``) of ``examples`` (featurized) or of
    ``rows`` (already featurized)."""
    import numpy as np
    import scipy.sparse
    from sklearn.neighbors import KNeighborsClassifier

    if rows is None:
        rows = _Rows()
        rows.blocks = [featurize([e.situation for e in examples or ()], groups)]
        rows.labels = [e.label for e in examples or ()]
    X = scipy.sparse.vstack(rows.blocks, format="csr") if len(rows.blocks) != 1 else rows.blocks[0]
    classes = sorted(set(rows.labels))
    index = {c: i for i, c in enumerate(classes)}
    y = np.fromiter((index[label] for label in rows.labels), dtype=np.int32, count=len(rows.labels))
    with warnings.catch_warnings():  # "more classes than half the samples": expected, calls are many
        warnings.simplefilter("ignore", UserWarning)
        knn = KNeighborsClassifier(n_neighbors=min(NEIGHBOURS, len(y)), metric="cosine", weights="distance",
                                   algorithm="brute").fit(X, y)
    return {"knn": knn, "classes": classes, "y": y, "groups": tuple(groups)}


def predict_model(model: dict, situations: Sequence[Situation], top_k: int) -> list[list[tuple[str, float]]]:
    """Each situation's best ``top_k`` (label, probability), best first (see the module's docstring)."""
    import numpy as np

    knn, y, classes = model["knn"], model["y"], model["classes"]
    X = featurize(situations, model["groups"])
    out = []
    for row in range(X.shape[0]):
        k = min(NEIGHBOURS, len(y))
        while True:  # every exact match votes (their shares are the probabilities), up to MAX_EXACT
            distances, indices = knn.kneighbors(X[row], n_neighbors=k)
            d, i = distances[0], indices[0]
            if d[-1] > EXACT or k >= min(len(y), MAX_EXACT):
                break
            k = min(len(y), MAX_EXACT, k * 8)
        d = np.maximum(d, 0.0)
        exact = d <= EXACT
        weights = exact.astype(float) if exact.any() else 1.0 / d
        scores = np.bincount(y[i], weights=weights, minlength=len(classes))
        p = scores / scores.sum() * max(0.0, 1.0 - float(d.min()))
        best = np.argsort(-p, kind="stable")[:top_k]
        out.append([(classes[j], round(float(min(1.0, p[j])), 6)) for j in best if p[j] > 0])
    return out


def _fit(spool: str, count: int, groups: tuple[str, ...], model_path: str) -> dict[str, Any]:
    """Featurize the spool's first ``count`` examples (what this worker has not yet), fit, write the model file."""
    started = time.perf_counter()
    rows = _ROWS.get((spool, groups))
    if rows is None or len(rows.labels) > count:
        rows = _ROWS[(spool, groups)] = _Rows()
    if len(_ROWS) > 4:  # another selector's spool: forget the oldest
        _ROWS.pop(next(iter(_ROWS)))
    new, rows.offset = read_spool(spool, rows.offset, count - len(rows.labels))
    if new:
        rows.blocks.append(featurize([e.situation for e in new], groups))
        rows.labels += [e.label for e in new]
    if len(rows.labels) != count:
        raise SelectorError(f"{spool}: holds {len(rows.labels)} examples, expected {count}")
    model = fit_model(None, groups, rows=rows)
    rows.blocks = [model["knn"]._fit_X]  # stacked once, not at every retrain
    tmp = model_path + ".tmp"
    with open(tmp, "wb") as f:
        pickle.dump(model, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, model_path)
    _MODEL.clear()
    _MODEL[model_path] = model
    return {"examples": count, "classes": len(model["classes"]), "seconds": time.perf_counter() - started}


def _predict(model_path: str, situation: bytes, top_k: int) -> list[tuple[str, float]]:
    model = _MODEL.get(model_path)
    if model is None:
        try:
            with open(model_path, "rb") as f:
                model = pickle.load(f)
        except FileNotFoundError:  # replaced by a newer model meanwhile
            return []
        _MODEL.clear()
        _MODEL[model_path] = model
    return predict_model(model, [_situation_decoder.decode(situation)], top_k)[0]


# -- files ---------------------------------------------------------------------------------------------------------
class _Saved(msgspec.Struct, kw_only=True):
    namespace: str
    examples: int
    examples_bytes: int
    model_examples: int = 0
    model_bytes: int = 0
    classes: int = 0
    sklearn: str = ""
    groups: list[str] = []


class BadFile(SelectorError):
    """A saved selector file that cannot be used (named, with the reason)."""


@functools.cache
def _sklearn_version() -> str:
    """The installed scikit-learn's version (its ``__version__``), read from the package's metadata: importing
    scikit-learn takes a second or more, and only the workers need it (called in a thread: it reads files)."""
    return importlib.metadata.version("scikit-learn")


def _save(path: Path, header: _Saved, spool: Path, model: Path | None) -> None:
    head = msgspec.json.encode(header)
    parts: list[bytes | mmap.mmap] = [_LEN.pack(len(head)) + head]
    with contextlib.ExitStack() as files:
        for part in (spool, model):
            if part is not None and part.stat().st_size:  # mapped, not read: a model may be large
                f = files.enter_context(open(part, "rb"))
                parts.append(files.enter_context(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)))
        SAVED.write_file(path, parts)


def _load(path: Path, namespace: str, spool: Path, model: Path) -> _Saved:
    """The saved file's header, its examples copied to ``spool`` and its model to ``model`` (``model_bytes`` 0 when
    it has none that can serve); ``BadFile`` naming the file when it cannot be used."""
    try:
        body = SAVED.read(path)
    except FramingError as exc:
        raise BadFile(str(exc)) from exc
    except OSError as exc:
        raise BadFile(f"{path}: cannot read: {exc}") from exc
    if body.nbytes < _LEN.size:
        raise BadFile(f"{path}: a body of {body.nbytes} bytes has no header")
    (n,) = _LEN.unpack_from(body, 0)
    at = _LEN.size
    try:
        header = msgspec.json.decode(body[at:at + n], type=_Saved)
    except msgspec.DecodeError as exc:
        raise BadFile(f"{path}: bad header: {exc}") from exc
    at += n
    if header.namespace != namespace:
        raise BadFile(f"{path}: namespace {header.namespace!r}, not this run's {namespace!r}")
    if at + header.examples_bytes + header.model_bytes != body.nbytes:
        raise BadFile(f"{path}: sizes in the header do not match the file")
    spool.write_bytes(body[at:at + header.examples_bytes])
    at += header.examples_bytes
    if header.model_bytes:
        model.write_bytes(body[at:at + header.model_bytes])
    return header


def _append(spool: Path, chunk: list[bytes], size: int) -> int:
    """Append ``chunk`` to the spool (``size`` bytes long before); on failure cut it back. The new size."""
    try:
        with open(spool, "ab") as f:
            for rec in chunk:
                f.write(rec)
        return size + sum(map(len, chunk))
    except BaseException:
        with open(spool, "r+b") as f:
            f.truncate(size)
        raise


def _reap(pool: concurrent.futures.ProcessPoolExecutor, processes: list[Any]) -> None:
    pool.shutdown(wait=False, cancel_futures=True)
    for p in processes:
        p.join(5.0)
        if p.is_alive():
            p.kill()
            p.join(5.0)
    pool.shutdown(wait=True)


# -- the selector ---------------------------------------------------------------------------------------------------
class SpecToolSelector:
    def __init__(self, namespace: str, *, model_dir: Path | None = None, retrain_every: int = 16, top_k: int = 3,
                 groups: tuple[str, ...] = FEATURE_GROUPS):
        unknown = set(groups) - set(FEATURE_GROUPS)
        if unknown or retrain_every < 1 or top_k < 1:
            raise ValueError(f"bad selector settings: groups {sorted(unknown)} unknown (known: {FEATURE_GROUPS}), "
                             f"retrain_every {retrain_every}, top_k {top_k}")
        self.namespace, self.retrain_every, self.top_k = namespace, retrain_every, top_k
        self.model_dir = Path(model_dir) if model_dir is not None else None
        self.groups = tuple(g for g in FEATURE_GROUPS if g in groups)
        self._pending: list[bytes] = []  # encoded examples not yet in the spool
        self._examples = 0  # learned, spooled or pending
        self._spooled = 0
        self._spool_bytes = 0
        self._submitted = 0  # examples a retrain has been started for
        self._trained = 0  # examples the current model learned from
        self._classes = 0
        self._retrains = 0
        self._last_train_s = 0.0
        self._model: Path | None = None
        self._generation = 0
        self._dir: Path | None = None
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._scope = TaskScope("spec-selector")  # the background retrain
        self._task: asyncio.Task[None] | None = None  # the retrain in flight (in the scope), if any
        self._closed = False

    async def __aenter__(self) -> SpecToolSelector:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def _spool(self) -> Path:
        assert self._dir is not None
        return self._dir / "examples.spool"

    # -- life cycle -----------------------------------------------------------------------------------------------
    async def open(self) -> None:
        """Ready to learn; with ``model_dir``, what a run of the same namespace saved there (else starts empty and
        logs why)."""
        self._dir = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="bunshin-spec-"))
        await asyncio.to_thread(self._spool.touch)
        if self.model_dir is not None:
            await self._open_saved(self.model_dir / FILE_NAME)
        if self._examples > self._trained or self._pending:
            self._kick(force=True)

    async def _open_saved(self, path: Path) -> None:
        if not await asyncio.to_thread(path.exists):
            log.info("spec selector: no saved model at %s, starting empty", path)
            return
        model = self._next_model_path()
        try:
            header = await asyncio.to_thread(_load, path, self.namespace, self._spool, model)
        except BadFile as exc:
            log.warning("spec selector: starting empty: %s", exc)
            await asyncio.to_thread(self._spool.write_bytes, b"")
            return
        except Exception as exc:  # a damaged file must never stop a run
            log.warning("spec selector: starting empty: %s: cannot load: %r", path, exc)
            await asyncio.to_thread(self._spool.write_bytes, b"")
            return
        self._examples = self._spooled = self._submitted = header.examples
        self._spool_bytes = header.examples_bytes
        sklearn = await asyncio.to_thread(_sklearn_version)
        usable = header.model_bytes and header.sklearn == sklearn and tuple(header.groups) == self.groups
        if usable:
            self._model, self._trained, self._classes = model, header.model_examples, header.classes
            self._submitted = header.model_examples
        else:
            self._submitted = 0
            if header.model_bytes:
                log.info("spec selector: %s: model made by scikit-learn %s with groups %s; retraining its %d "
                         "examples", path, header.sklearn, header.groups, header.examples)
        log.info("spec selector: loaded %d examples%s from %s", header.examples,
                 f" and a model of {header.classes} calls" if usable else "", path)

    async def close(self) -> None:
        """Stops training (no worker process is left), saves examples and model into ``model_dir`` when set and
        removes the temporary files. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._task = None
        pool, self._pool = self._pool, None
        processes = list(getattr(pool, "_processes", {}).values()) if pool is not None else []
        for p in processes:  # before any await: a cancelled close still stops them
            p.terminate()
        try:
            try:
                await self._scope.aclose()  # the retrain, cancelled and awaited
            finally:
                if pool is not None:  # a thread: run to its end even when this close is cancelled
                    await run_to_end(asyncio.to_thread(_reap, pool, processes))
            if self.model_dir is not None and self._dir is not None:
                await self._save()
        finally:
            if self._dir is not None:
                directory, self._dir = self._dir, None
                await asyncio.shield(asyncio.to_thread(shutil.rmtree, directory, True))

    async def _save(self) -> None:
        assert self.model_dir is not None
        chunk, self._pending = self._pending, []
        if chunk:
            self._spool_bytes = await asyncio.to_thread(_append, self._spool, chunk, self._spool_bytes)
            self._spooled += len(chunk)
        model = self._model
        model_bytes = (await asyncio.to_thread(os.path.getsize, model)) if model is not None else 0
        sklearn = await asyncio.to_thread(_sklearn_version)
        header = _Saved(namespace=self.namespace, examples=self._spooled,
                        examples_bytes=self._spool_bytes, model_examples=self._trained if model else 0,
                        model_bytes=model_bytes, classes=self._classes, sklearn=sklearn,
                        groups=list(self.groups))
        await asyncio.to_thread(self.model_dir.mkdir, parents=True, exist_ok=True)
        await asyncio.to_thread(_save, self.model_dir / FILE_NAME, header, self._spool, model)

    # -- learning -------------------------------------------------------------------------------------------------
    def learn(self, situation: Situation, label: str) -> None:
        """One example (cheap, no I/O); every ``retrain_every`` new examples a background retrain starts."""
        if self._closed:
            return
        if len(label) > MAX_LABEL:
            return
        self._pending.append(record(situation, label))
        self._examples += 1
        if self._examples - self._submitted >= self.retrain_every:
            self._kick()

    def learn_trajectory(self, t: Trajectory, template: str) -> None:
        for situation, label in examples_of(t, template):
            self.learn(situation, label)

    def learn_file(self, path: Path, templates: dict[str, str]) -> int:
        """Every trajectory of a JSON Lines file (``--spec-train``); the examples added. ``TrainFileError`` names
        the file and line of what cannot be read (nothing of the file is learned then)."""
        path = Path(path)
        trajectories = []
        try:
            with open(path, "rb") as f:
                for number, line in enumerate(f, start=1):
                    if line.strip():
                        try:
                            trajectories.append(_trajectory_decoder.decode(line))
                        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                            raise TrainFileError(path, number, f"not a trajectory: {exc}") from exc
        except OSError as exc:
            raise TrainFileError(path, None, f"cannot read: {exc.strerror or exc}") from exc
        before = self._examples
        for t in trajectories:
            self.learn_trajectory(t, templates.get(t.task_id, ""))
        return self._examples - before

    def _kick(self, force: bool = False) -> None:
        """Start the retrain task unless one runs (it goes on while enough new examples came in meanwhile)."""
        if self._closed or self._dir is None or (self._task is not None and not self._task.done()):
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # not on the loop (learning a file before the run): the next retrain takes them
            return
        self._task = self._scope.start_soon(self._retrain(force), name="spec-selector-retrain")

    async def _retrain(self, force: bool) -> None:
        try:
            while not self._closed and (self._examples - self._submitted >= (1 if force else self.retrain_every)):
                await self._retrain_once()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a failed retrain keeps the model it had
            log.warning("spec selector: retrain failed, keeping the previous model: %r", exc)

    def _next_model_path(self) -> Path:
        assert self._dir is not None
        self._generation += 1
        return self._dir / f"model-{self._generation}.pkl"

    def _ensure_pool(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._closed:
            raise SelectorError("the spec selector is closed")
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                WORKERS, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init)
        return self._pool

    async def _retrain_once(self) -> None:
        chunk, self._pending = self._pending, []
        if chunk:
            try:
                self._spool_bytes = await asyncio.to_thread(_append, self._spool, chunk, self._spool_bytes)
            except BaseException:
                self._pending = chunk + self._pending
                raise
            self._spooled += len(chunk)
        count, model, previous = self._spooled, self._next_model_path(), self._model
        self._submitted = count
        started = time.monotonic()
        try:
            result = await asyncio.wrap_future(self._ensure_pool().submit(
                _fit, str(self._spool), count, self.groups, str(model)))
        except BrokenProcessPool:
            self._pool = None  # a worker died (killed, out of memory): a new pool next time
            self._submitted = self._trained
            raise
        except BaseException:
            self._submitted = self._trained
            raise
        self._model, self._trained, self._classes = model, result["examples"], result["classes"]
        self._retrains += 1
        self._last_train_s = round(time.monotonic() - started, 3)
        if previous is not None:
            await asyncio.to_thread(previous.unlink, True)

    async def retrain_now(self) -> None:
        """Waits for a retrain in flight, then retrains on every example not yet trained (if any) and waits for it.
        Cancelling the caller leaves the retrain running."""
        for _ in range(2):
            task = self._task
            if task is None or task.done():
                if self._closed or self._examples <= self._submitted:
                    return
                self._kick(force=True)
                task = self._task
                if task is None:
                    return
            await asyncio.wait([task])

    # -- predicting -----------------------------------------------------------------------------------------------
    async def predict(self, situation: Situation) -> list[Prediction]:
        """The best ``top_k`` next calls, best first; [] before any model exists (or when the workers fail)."""
        model = self._model
        if model is None or self._closed:
            return []
        data = _example_encoder.encode(situation.bounded())
        try:
            found = await asyncio.wrap_future(self._ensure_pool().submit(_predict, str(model), data, self.top_k))
        except (BrokenProcessPool, SelectorError, OSError, pickle.UnpicklingError) as exc:
            log.warning("spec selector: prediction failed: %r", exc)
            if isinstance(exc, BrokenProcessPool):
                self._pool = None
            return []
        return [Prediction(label=label, call=_call_decoder.decode(label), p=p) for label, p in found]

    def statistics(self) -> dict[str, Any]:
        return {"examples": self._examples, "retrains": self._retrains, "last_train_s": self._last_train_s,
                "classes": self._classes, "model_examples": self._trained}

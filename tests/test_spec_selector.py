"""The Spec Tool Selector: learning and predicting, never seeing a reference, saving and loading by namespace,
``--spec-train`` files, an event loop that keeps ticking while it retrains, and no worker process left behind."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from bunshin.engine.records import Step, StepObservation, ToolCall, Trajectory, canonical, write_jsonl
from bunshin.engine.speculation import selector as selector_module
from bunshin.engine.speculation.features import FEATURE_GROUPS, Situation, examples_of, featurize, label_of
from bunshin.engine.speculation.selector import FILE_NAME, SpecToolSelector, TrainFileError
from tests.quiet import all_tasks_blocked, until

from .conftest import _cpu_wait_s as cpu_wait_s

CLICK = ToolCall(name="click", args={"element_id": 12})
SCROLL = ToolCall(name="scroll", args={"direction": "down"})
STOP = ToolCall(name="stop", args={"answer": "3"})


def situation(step: int = 0, observation: str = "Tab 0: Home Page\n[12] link 'Shoes'", instruction: str = "buy shoes",
              calls: tuple[str, ...] = ()) -> Situation:
    return Situation(suite="webshop", template="buy", instruction=instruction, step=step, calls=calls,
                     observation=observation)


def trajectory(task_id: str, sample: int, calls: list[ToolCall], final: ToolCall | None = STOP) -> Trajectory:
    steps = [Step(index=i, call=c, observation=StepObservation(output=f"page after {canonical(c).decode()} #{i}"),
                  reasoning_s=0.0, tool_s=0.0) for i, c in enumerate(calls)]
    return Trajectory(task_id=task_id, suite="webshop", group_id="g", sample=sample, seed=sample,
                      instruction="How many reviews does Orchid R812 have?",
                      first_observation=StepObservation(output="Tab 0: Home Page"), steps=steps, final=final)


def own_children() -> set[int]:
    """Live children of this process, less multiprocessing's resource tracker (one per Python process, shared by
    every user of multiprocessing, it exits with us)."""
    from multiprocessing import resource_tracker

    tracker = getattr(resource_tracker._resource_tracker, "_pid", None)  # noqa: SLF001
    me, found = os.getpid(), set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == me and stat[0] != "Z" and int(entry.name) != tracker:
                found.add(int(entry.name))
            elif int(stat[1]) == me and stat[0] == "Z":
                found.add(int(entry.name))  # an unreaped child counts too
    return found


def test_examples_of_a_trajectory() -> None:
    t = trajectory("0", 0, [CLICK, SCROLL])
    t.steps[1] = msgspec.structs.replace(t.steps[1], observation=StepObservation(output="x", error="boom"))
    examples = examples_of(t, "reviews")
    assert [label for _, label in examples] == [label_of(CLICK), label_of(SCROLL), label_of(STOP)]
    assert [s.step for s, _ in examples] == [0, 1, 2]
    assert examples[0][0].observation == "Tab 0: Home Page" and examples[0][0].calls == ()
    assert examples[1][0].calls == (label_of(CLICK),) and examples[1][0].observation.startswith("page after")
    assert examples[2][0].observation == "ERROR: boom\nx"
    assert all(s.template == "reviews" and s.instruction == t.instruction for s, _ in examples)
    assert len(examples_of(trajectory("0", 0, [CLICK], final=None), "")) == 1


def test_featurizer_bounds_hostile_text() -> None:
    huge = situation(observation="word " * 2_000_000 + "\n" * 100_000, calls=tuple(["x" * 100_000] * 1000))
    featurize([situation()])  # imports scikit-learn
    started = time.perf_counter()
    X = featurize([huge])
    assert time.perf_counter() - started < 0.5
    assert X.nnz < 600
    assert len(msgspec.msgpack.encode(huge.bounded())) < 64 << 10
    for removed in FEATURE_GROUPS:  # each group contributes something of its own
        assert (featurize([huge], tuple(g for g in FEATURE_GROUPS if g != removed)) != X).nnz > 0


@pytest.mark.asyncio
async def test_learns_and_predicts() -> None:
    async with SpecToolSelector("ns", retrain_every=1000, top_k=3) as sel:
        assert await sel.predict(situation()) == []  # no model yet
        seen = situation(observation="Tab 0: Search results\n[32] link 'Orchid R812'")
        for i in range(20):  # the usual call 70%, two detours
            sel.learn(seen, label_of(CLICK) if i % 10 < 7 else label_of(SCROLL if i % 10 < 9 else STOP))
        sel.learn(situation(step=3, observation="Tab 0: Cart\n[5] button 'Checkout'"), label_of(STOP))
        await sel.retrain_now()
        assert sel.statistics()["model_examples"] == 21 and sel.statistics()["classes"] == 3
        predictions = await sel.predict(seen)
        assert [p.label for p in predictions] == [label_of(CLICK), label_of(SCROLL), label_of(STOP)]
        assert predictions[0].call == CLICK
        assert predictions[0].p == pytest.approx(0.7) and predictions[1].p == pytest.approx(0.2)
        assert all(0 <= p.p <= 1 for p in predictions)
        cart = await sel.predict(situation(step=3, observation="Tab 0: Cart\n[5] button 'Checkout'"))
        assert cart[0].label == label_of(STOP) and cart[0].p == pytest.approx(1.0)
        stranger = await sel.predict(Situation(suite="webshop", template="other", instruction="write a poem",
                                               step=17, calls=("zzz",), observation="nothing like it " * 50))
        assert not stranger or stranger[0].p < 0.5  # unfamiliar: low confidence


@pytest.mark.asyncio
async def test_never_reads_the_reference() -> None:
    """Two tasks whose references differ but whose trajectories are equal: the selector cannot tell them apart,
    because it learns from trajectories alone (a task's reference is not among its inputs)."""
    from bunshin.envs.suites.base import SuiteTask

    tasks = [SuiteTask(suite="webshop", id=i, template="reviews", instruction="How many reviews?", path="",
                       reference=[ToolCall(name="stop", args={"answer": answer})]) for i, answer in (("a", "1"),
                                                                                                    ("b", "9"))]
    calls = [ToolCall(name="type", args={"element_id": 19, "text": "Orchid"}), CLICK]
    answers = {}
    for task in tasks:
        async with SpecToolSelector("ns", retrain_every=1000) as sel:
            for sample in range(3):
                t = trajectory(task.id, sample, calls, final=STOP)
                t.instruction = task.instruction
                sel.learn_trajectory(t, task.template)
            await sel.retrain_now()
            probe = examples_of(trajectory(task.id, 9, calls), task.template)
            answers[task.id] = [[(p.label, p.p) for p in await sel.predict(s)] for s, _ in probe]
    assert answers["a"] == answers["b"]
    assert answers["a"][-1][0][0] == label_of(STOP)  # what the trajectories did, not either reference


@pytest.mark.asyncio
async def test_saves_and_loads_by_namespace(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    seen = situation(observation="Tab 0: Product\n[40] link '1 Reviews'")
    async with SpecToolSelector("shop:v1", model_dir=tmp_path, retrain_every=1000) as sel:
        for _ in range(5):
            sel.learn(seen, label_of(CLICK))
        await sel.retrain_now()
        sel.learn(situation(step=1), label_of(SCROLL))  # learned after the last retrain: saved, not yet trained
    assert (tmp_path / FILE_NAME).exists() and not list(tmp_path.glob("*.tmp"))

    async with SpecToolSelector("shop:v1", model_dir=tmp_path, retrain_every=1000) as sel:
        assert sel.statistics()["examples"] == 6
        assert (await sel.predict(seen))[0].label == label_of(CLICK)  # the saved model, at once
        await sel.retrain_now()  # the examples continue
        assert sel.statistics()["model_examples"] == 6

    caplog.set_level(logging.INFO, logger=selector_module.__name__)
    async with SpecToolSelector("shop:v2", model_dir=tmp_path) as sel:
        assert sel.statistics()["examples"] == 0 and await sel.predict(seen) == []
    assert "namespace" in caplog.text

    # another namespace's run saved over it: v1 now starts empty too (one model per cache directory)
    async with SpecToolSelector("shop:v1", model_dir=tmp_path) as sel:
        assert sel.statistics()["examples"] == 0


@pytest.mark.asyncio
@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
async def test_a_damaged_file_starts_empty(tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str) -> None:
    async with SpecToolSelector("ns", model_dir=tmp_path, retrain_every=1000) as sel:
        for _ in range(4):
            sel.learn(situation(), label_of(CLICK))
        await sel.retrain_now()
    path = tmp_path / FILE_NAME
    data = path.read_bytes()
    path.write_bytes({"truncate": data[: len(data) // 2], "flip": data[:40] + bytes([data[40] ^ 1]) + data[41:],
                      "garbage": os.urandom(300), "empty": b""}[damage])
    with caplog.at_level(logging.WARNING, logger=selector_module.__name__):
        async with SpecToolSelector("ns", model_dir=tmp_path) as sel:
            assert sel.statistics()["examples"] == 0 and await sel.predict(situation()) == []
    assert str(path) in caplog.text


@pytest.mark.asyncio
async def test_learn_file(tmp_path: Path) -> None:
    good = tmp_path / "train.jsonl"
    write_jsonl(good, [trajectory("7", s, [CLICK, SCROLL]) for s in range(3)])
    async with SpecToolSelector("ns", retrain_every=1000) as sel:
        assert sel.learn_file(good, {"7": "reviews"}) == 9
        await sel.retrain_now()
        first = examples_of(trajectory("7", 0, [CLICK]), "reviews")[0][0]
        assert (await sel.predict(first))[0].label == label_of(CLICK)

        bad = tmp_path / "bad.jsonl"
        bad.write_bytes(good.read_bytes().splitlines(keepends=True)[0] + b"\n" + b'{"task_id": 3}\n')
        with pytest.raises(TrainFileError) as info:
            sel.learn_file(bad, {})
        assert info.value.path == bad and info.value.line == 3 and f"{bad}:3" in str(info.value)
        with pytest.raises(TrainFileError, match="missing.jsonl"):
            sel.learn_file(tmp_path / "missing.jsonl", {})
        assert sel.statistics()["examples"] == 9  # nothing of a bad file is learned


# Run in a fresh interpreter: this test process may have imported scikit-learn already (``featurize`` above).
SAVE_AND_LOAD = """
import asyncio, sys
from pathlib import Path
from bunshin.engine.speculation.features import Situation, label_of
from bunshin.engine.speculation.selector import SpecToolSelector
from bunshin.envs.records import ToolCall

async def main(directory: Path) -> None:
    seen = Situation(suite="webshop", template="buy", instruction="buy shoes", step=0, calls=(),
                     observation="Tab 0: Home Page [12] link 'Shoes'")
    click = label_of(ToolCall(name="click", args={"element_id": 12}))
    async with SpecToolSelector("ns", model_dir=directory, retrain_every=1000) as sel:
        for _ in range(3):
            sel.learn(seen, click)
        await sel.retrain_now()
        assert [p.label for p in await sel.predict(seen)] == [click]
    async with SpecToolSelector("ns", model_dir=directory, retrain_every=1000) as sel:
        assert sel.statistics()["model_examples"] == 3, sel.statistics()  # the saved model: its version matched
    print(sorted({m.split(".")[0] for m in sys.modules} & {"sklearn", "scipy"}))

asyncio.run(main(Path(sys.argv[1])))
"""


def test_the_engine_process_never_imports_scikit_learn(tmp_path: Path) -> None:
    """Importing scikit-learn takes a second or more (scipy, numpy): on the event loop, where the selector once did
    it for the version a saved file records, it blocked the loop. Only the workers import it; the version a saved
    file records is scikit-learn's own, read from its metadata."""
    done = subprocess.run([sys.executable, "-c", SAVE_AND_LOAD, str(tmp_path)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
    import sklearn

    assert selector_module._sklearn_version() == sklearn.__version__
    body = selector_module.SAVED.read(tmp_path / FILE_NAME)  # a length, the JSON header, examples, model
    (n,) = selector_module._LEN.unpack_from(body, 0)
    header = msgspec.json.decode(body[selector_module._LEN.size:selector_module._LEN.size + n])
    assert header["sklearn"] == sklearn.__version__ and header["model_bytes"] > 0


def big_examples(n: int, seed: int = 0) -> list[tuple[Situation, str]]:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(5000)]
    out = []
    for i in range(n):
        page = "\n".join(f"[{rng.randrange(999)}] link '{' '.join(rng.choices(words, k=6))}'" for _ in range(200))
        out.append((situation(step=i % 12, observation=page[:8192], instruction=f"task {i % 50}",
                              calls=(f"c{i % 7}",)), f'{{"args":{{"element_id":{i % 400}}},"name":"click"}}'))
    return out


@pytest.mark.asyncio
async def test_the_loop_keeps_ticking_while_it_retrains() -> None:
    """20k examples of 8 KiB pages: featurizing them takes seconds (measured inline below, off the loop); while the
    selector retrains on them and answers predictions, the event loop is never late by more than 50 ms."""
    print("seed 0")
    examples = await asyncio.to_thread(big_examples, 20_000)
    async with SpecToolSelector("ns", retrain_every=1 << 30) as sel:
        for k in range(0, len(examples), 500):  # learn is cheap, but give the loop a turn now and then
            for s, label in examples[k:k + 500]:
                sel.learn(s, label)
            await asyncio.sleep(0)
        worst, ticks, stop = 0.0, 0, False

        async def tick() -> None:
            nonlocal worst, ticks
            while not stop:
                before, waited = time.monotonic(), cpu_wait_s()
                await asyncio.sleep(0.005)  # the ticker measures how late the loop wakes it
                # time the loop's thread spent runnable, waiting for a CPU (the machine's load, not our code holding
                # the loop) is not counted, as the loop watchdog does not count it (conftest.py)
                late = time.monotonic() - before - 0.005 - (cpu_wait_s() - waited)
                worst, ticks = max(worst, late), ticks + 1

        ticker = asyncio.create_task(tick())
        await asyncio.sleep(1.0)  # a measuring window: how late the machine's load alone makes the loop
        idle, worst = worst, 0.0
        started = time.monotonic()
        await sel.retrain_now()
        retrain_s = time.monotonic() - started
        for s, label in examples[:20]:
            assert (await sel.predict(s))[0].label == label  # seen situations, answered
        stop = True
        await ticker
        assert sel.statistics()["model_examples"] == 20_000
    print(f"retrain {retrain_s:.2f} s, {ticks} ticks, worst loop lag {worst * 1000:.1f} ms "
          f"(idle: {idle * 1000:.1f} ms)")
    assert worst < 0.05 + idle

    # the same featurizing on one thread (as it would run on the loop) blocks for far longer than that
    started = time.perf_counter()
    await asyncio.to_thread(featurize, [s for s, _ in examples[:5000]])
    inline_s = (time.perf_counter() - started) * 4
    print(f"featurizing inline would block the loop for about {inline_s:.2f} s")
    assert inline_s > 20 * 0.05


@pytest.mark.asyncio
async def test_no_worker_left_after_close_or_cancellation() -> None:
    """A close cancelled while it reaps the workers of a retrain in flight still reaps them before it ends, and no
    task of the selector is left."""
    before, tasks_before = own_children(), set(asyncio.all_tasks())
    examples = await asyncio.to_thread(big_examples, 8000, 1)
    sel = SpecToolSelector("ns", retrain_every=1 << 30)
    await sel.open()
    for s, label in examples:
        sel.learn(s, label)
    waiter = asyncio.create_task(sel.retrain_now())
    assert await until(lambda: own_children() - before, 60)  # the retrain's worker processes started
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter

    closer = asyncio.create_task(sel.close())
    await all_tasks_blocked()  # the close is reaping the workers, in a thread
    closer.cancel()  # a cancelled close still stops the workers
    with pytest.raises(asyncio.CancelledError):
        await closer
    assert not own_children() - before and not multiprocessing.active_children()
    assert {t for t in asyncio.all_tasks() if t not in tasks_before and t is not asyncio.current_task()} == set()

    async with SpecToolSelector("ns", retrain_every=4) as sel:  # and after a plain close
        for s, label in examples[:8]:
            sel.learn(s, label)
        await sel.retrain_now()
        assert sel.statistics()["retrains"] >= 1
    assert not own_children() - before and not multiprocessing.active_children()

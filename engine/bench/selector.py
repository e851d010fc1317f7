"""``bunshin bench selector``: how well the Spec Tool Selector predicts the next call, offline, per detour rate of
the policy, and (``--ablate``) which feature groups earn their keep.

Owns: the procedure. Per detour rate, one ``RolloutEngine`` (base mode, no prefix cache, policy and suite at time
scale 0) records ``epochs`` epochs of the same ``tasks`` groups of ``group_size`` (``epoch.choose_tasks``; epoch
``e`` runs with run seed ``seed + e``, as ``bench epoch`` does). Then, for each epoch ``e >= 2``, a fresh selector
learns every example of epochs ``< e`` (``retrain_now``) and predicts every decision of epoch ``e`` through its real
path (``predict``: a worker process): top-1 and top-k are the shares of decisions whose call was the first, or among
the ``top_k``, predictions (no prediction counts as a miss). ``online`` (epoch 1 within itself): a decision of sample
``j`` is predicted by a selector that learned the samples ``< j`` of every group of epoch 1 (GRPO samples of a group
run side by side; this is what a selector retrained as rollouts finish knows, at best). ``--ablate``: the same
after-epoch-1 figures with each feature group removed. ``--record-dir``: keep the recorded trajectories there and
reuse them when the same configuration asks again.
Must never: show the selector a task's reference (it learns from trajectories only) or compare detour rates that
ran different tasks or seeds.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bunshin.envs.suites.base import Suite

from ..commands.flags import make_suite, with_time_scale
from ..errors import BadRequest, CommandError
from ..records import Trajectory, read_jsonl, write_jsonl
from ..report import markdown_table, pyplot, write_json
from ..speculation.features import FEATURE_GROUPS, examples_of
from ..speculation.selector import SpecToolSelector
from .policy import bench_policy


def add_arguments(parser: Any) -> None:
    """``bench selector``'s flags (the suite's are ``commands.flags.suite_arguments``)."""
    parser.add_argument("--policy", choices=["grounded", "scripted"], default="grounded")
    parser.add_argument("--detour-p", type=_rates, default=None,
                        help="the policy's detour probabilities, a comma list (default: its own)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=10, help="groups per epoch: one task each, across templates")
    parser.add_argument("--group-size", type=int, default=6, help="samples per task (default 6, as bench epoch)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0, help="epoch e runs with run seed SEED + e")
    parser.add_argument("--top-k", type=int, default=3)
    parser.add_argument("--ablate", action="store_true", help="also each feature group removed")
    parser.add_argument("--no-online", action="store_true", help="skip the within-epoch-1 measurement")
    parser.add_argument("--record-dir", type=Path, help="keep (and reuse) the recorded trajectories here")
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    parser.add_argument("--plot", type=Path, help="write a PNG bar plot here")


def _rates(text: str) -> list[float]:
    import argparse

    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"bad detour rates {text!r}: {exc}") from exc
    if not rates or any(not 0 <= r < 1 for r in rates):
        raise argparse.ArgumentTypeError(f"detour rates must be in [0, 1), got {text!r}")
    return rates


# -- recording ------------------------------------------------------------------------------------------------------
async def record_epochs(suite: Suite, policy: Any, *, epochs: int, tasks: int, group_size: int, seed: int,
                        engine_kwargs: dict[str, Any], log: Any = sys.stderr
                        ) -> tuple[dict[int, list[Trajectory]], dict[str, str]]:
    """Every epoch's trajectories (by epoch, 1-based) and the templates of the tasks."""
    from ..rollout import RolloutEngine
    from .epoch import choose_tasks

    out = {}
    async with RolloutEngine(suite, policy, **engine_kwargs) as engine:
        ids = choose_tasks(engine, policy, tasks)
        if not ids:
            raise BadRequest(f"the policy {policy.name} takes no task of suite {suite.name}")
        templates = {i: engine.tasks[i].template for i in ids}
        for epoch in range(1, epochs + 1):
            started = time.monotonic()
            results = await engine.run(engine.requests(ids, group_size=group_size, seed=seed + epoch))
            out[epoch] = [r.trajectory for r in results]
            print(f"recorded epoch {epoch}: {len(results)} rollouts, "
                  f"{sum(len(t.steps) for t in out[epoch])} steps, {time.monotonic() - started:.1f} s",
                  file=log, flush=True)
    return out, templates


def _recording(record_dir: Path | None, key: str, epoch: int) -> Path | None:
    return record_dir / f"{key}-epoch{epoch}.jsonl" if record_dir is not None else None


# -- measuring ------------------------------------------------------------------------------------------------------
async def measure(train: list[Trajectory], test: list[Trajectory], templates: dict[str, str], *, top_k: int,
                  groups: tuple[str, ...] = FEATURE_GROUPS) -> dict[str, Any]:
    """A fresh selector learns ``train``; top-1/top-k over ``test``'s decisions."""
    async with SpecToolSelector("bench", retrain_every=1 << 30, top_k=top_k, groups=groups) as selector:
        for t in train:
            selector.learn_trajectory(t, templates.get(t.task_id, ""))
        started = time.monotonic()
        await selector.retrain_now()
        train_s = time.monotonic() - started
        hits1 = hitsk = n = 0
        latencies = []
        for t in test:
            for situation, label in examples_of(t, templates.get(t.task_id, "")):
                before = time.perf_counter()
                predictions = await selector.predict(situation)
                latencies.append((time.perf_counter() - before) * 1000)
                labels = [p.label for p in predictions]
                n += 1
                hits1 += bool(labels) and labels[0] == label
                hitsk += label in labels
        stats = selector.statistics()
    return {"top1": round(hits1 / n, 4) if n else 0.0, "topk": round(hitsk / n, 4) if n else 0.0,
            "decisions": n, "examples": stats["model_examples"], "classes": stats["classes"],
            "train_s": round(train_s, 3), "predict_ms_p50": round(statistics.median(latencies), 3) if latencies else 0.0}


async def online(epoch1: list[Trajectory], templates: dict[str, str], *, top_k: int) -> dict[str, Any]:
    """Epoch 1 within itself: sample ``j``'s decisions predicted from samples ``< j`` (``j >= 1``)."""
    samples = sorted({t.sample for t in epoch1})
    hits1 = hitsk = n = 0
    for j in samples[1:]:
        r = await measure([t for t in epoch1 if t.sample < j], [t for t in epoch1 if t.sample == j], templates,
                          top_k=top_k)
        hits1 += round(r["top1"] * r["decisions"])
        hitsk += round(r["topk"] * r["decisions"])
        n += r["decisions"]
    return {"top1": round(hits1 / n, 4) if n else 0.0, "topk": round(hitsk / n, 4) if n else 0.0, "decisions": n}


async def main(suite: Suite, make_policy: Callable[[float | None], Any], rates: list[float | None], *,
               epochs: int, tasks: int, group_size: int, seed: int, top_k: int, ablate: bool, with_online: bool,
               engine_kwargs: dict[str, Any], record_dir: Path | None = None, json_path: Path | None = None,
               plot_path: Path | None = None, config: dict[str, Any] | None = None, log: Any = sys.stderr) -> int:
    if epochs < 2 or tasks < 1 or group_size < 1:
        raise BadRequest(f"need epochs >= 2 (train on earlier ones), tasks and group size >= 1; got {epochs}, "
                         f"{tasks}, {group_size}")
    rows, ablation = [], []
    for rate in rates:
        policy = make_policy(rate)
        key = f"{suite.name}-{policy.name}-d{rate}-t{tasks}-g{group_size}-s{seed}"
        paths = [_recording(record_dir, key, e) for e in range(1, epochs + 1)]
        if all(p is not None and p.exists() for p in paths):
            recorded = {e: list(read_jsonl(p)) for e, p in enumerate(paths, start=1) if p is not None}
            templates = {t.id: t.template for t in await asyncio.to_thread(suite.tasks)}
            print(f"detour {rate}: reusing the trajectories in {record_dir}", file=log)
        else:
            recorded, templates = await record_epochs(suite, policy, epochs=epochs, tasks=tasks,
                                                      group_size=group_size, seed=seed,
                                                      engine_kwargs=engine_kwargs, log=log)
            if record_dir is not None:
                record_dir.mkdir(parents=True, exist_ok=True)
                for e, p in enumerate(paths, start=1):
                    if p is not None:
                        write_jsonl(p, recorded[e])
        label = "default" if rate is None else rate
        for e in range(2, epochs + 1):
            train = [t for k in range(1, e) for t in recorded[k]]
            r = await measure(train, recorded[e], templates, top_k=top_k)
            rows.append({"detour_p": label, "epoch": e, **r})
            print(f"detour {label}, epoch {e}: top-1 {r['top1']:.3f}, top-{top_k} {r['topk']:.3f}", file=log)
            if ablate and e == 2:
                for removed in ("none", *FEATURE_GROUPS):
                    groups = tuple(g for g in FEATURE_GROUPS if g != removed)
                    a = r if removed == "none" else await measure(train, recorded[e], templates, top_k=top_k,
                                                                  groups=groups)
                    ablation.append({"detour_p": label, "epoch": e, "removed": removed, "top1": a["top1"],
                                     "topk": a["topk"], "d_top1": round(a["top1"] - r["top1"], 4),
                                     "d_topk": round(a["topk"] - r["topk"], 4)})
        if with_online:
            o = await online(recorded[1], templates, top_k=top_k)
            rows.append({"detour_p": label, "epoch": "1 (online)", **o})
    columns = [("detour_p", "detour p"), ("epoch", "test epoch"), ("top1", "top-1"), ("topk", f"top-{top_k}"),
               ("decisions", "decisions"), ("examples", "examples"), ("classes", "classes"),
               ("train_s", "train s"), ("predict_ms_p50", "predict ms p50")]
    print(f"## Spec Tool Selector, {suite.name}, {tasks} groups of {group_size}, trained on the epochs before\n")
    print(markdown_table(rows, columns))
    if ablation:
        print("\n## Ablation (test epoch 2): each feature group removed\n")
        print(markdown_table(ablation, [("detour_p", "detour p"), ("removed", "removed group"), ("top1", "top-1"),
                                        ("topk", f"top-{top_k}"), ("d_top1", "Δ top-1"), ("d_topk", f"Δ top-{top_k}")]))
    if json_path:
        write_json(json_path, {"suite": suite.name, "epochs": epochs, "tasks": tasks, "group_size": group_size,
                               "seed": seed, "top_k": top_k, "config": config or {}, "results": rows,
                               "ablation": ablation})
    if plot_path:
        await asyncio.to_thread(plot, rows, ablation, plot_path, top_k, f"{suite.name}, {tasks}x{group_size}")
        print(f"wrote {plot_path}", file=log)
    return 0


def plot(rows: list[dict[str, Any]], ablation: list[dict[str, Any]], path: Path, top_k: int, title: str) -> None:
    plt = pyplot()
    panels = 2 if ablation else 1
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 3.6), squeeze=False)
    shown = [r for r in rows if r["epoch"] == 2 or str(r["epoch"]).startswith("1")]
    names = [f"p={r['detour_p']}\n{'e2' if r['epoch'] == 2 else 'e1 online'}" for r in shown]
    xs = range(len(shown))
    ax = axes[0][0]
    ax.bar([x - 0.2 for x in xs], [r["top1"] for r in shown], 0.4, label="top-1")
    ax.bar([x + 0.2 for x in xs], [r["topk"] for r in shown], 0.4, label=f"top-{top_k}")
    ax.set_xticks(list(xs), names, fontsize=8)
    ax.set_ylim(0, 1)
    ax.axhline(0.55, color="grey", lw=0.8, ls="--")
    ax.set_title(f"selector accuracy ({title})", fontsize=9)
    ax.legend(fontsize=8)
    if ablation:
        ax = axes[0][1]
        xs = range(len(ablation))
        ax.bar([x - 0.2 for x in xs], [a["top1"] for a in ablation], 0.4, label="top-1")
        ax.bar([x + 0.2 for x in xs], [a["topk"] for a in ablation], 0.4, label=f"top-{top_k}")
        ax.set_xticks(list(xs), [f"-{a['removed']} p={a['detour_p']}" for a in ablation], fontsize=7, rotation=90)
        ax.set_ylim(0, 1)
        ax.set_title("ablation: group removed (test epoch 2)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def command(args: Any) -> int:
    """``bunshin bench selector`` from its parsed arguments (suite and policy at time scale 0); what it refuses is
    a ``CommandError``."""
    from .. import event_loop

    with_time_scale(args, 0.0)
    suite = make_suite(args)
    rates: list[float | None] = list(args.detour_p) if args.detour_p else [None]
    try:
        for rate in rates:
            bench_policy(args.policy, 0.0, rate)
    except BadRequest as exc:
        raise CommandError(f"bunshin bench selector: {exc}") from exc
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
              if k not in ("command", "bench", "set")}
    engine_kwargs = {"concurrency": args.concurrency, "max_steps": args.max_steps}
    try:
        return event_loop.run(main(
            suite, lambda rate: bench_policy(args.policy, 0.0, rate), rates, epochs=args.epochs, tasks=args.tasks,
            group_size=args.group_size, seed=args.seed, top_k=args.top_k, ablate=args.ablate,
            with_online=not args.no_online, engine_kwargs=engine_kwargs, record_dir=args.record_dir,
            json_path=args.json, plot_path=args.plot, config=config))
    except BadRequest as exc:
        raise CommandError(f"bunshin bench selector: {exc}") from exc

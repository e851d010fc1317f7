"""The ``bunshin`` command line: ``doctor``, ``demo``, ``eval``, ``replay``, ``suite check``, ``bench fork``,
``bench sharing``, ``bench epoch``, ``bench selector``, ``bench graft``.

Owns: parsing arguments and dispatching; every command's work lives in its own module.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

from bunshin.envs.runtime.fork.registry import BACKENDS

from . import event_loop


def nbytes_of(value: str | int) -> int:
    """Parse sizes such as ``64M``, ``1G``, ``256MiB``, ``4096``."""
    if isinstance(value, int):
        return value
    text = value.strip().upper().removesuffix("B").removesuffix("I")
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


DEFAULT = "default"  # a budget flag not given: PrefixSettings' own default


def budget_of(value: str) -> int | str | None:
    """A budget in bytes (``256M``...), ``none`` for unbounded (``default``: the flag was left out)."""
    text = value.strip().lower()
    return None if text in ("none", "unbounded") else DEFAULT if text == DEFAULT else nbytes_of(value)


def spec_memory_of(value: str) -> tuple[str, float] | str | None:
    """``--spec-memory``: ``10%`` (the branches may lift the run's memory this far above the most it held without
    them), ``256M`` (bytes the branches may hold), ``none`` (unbounded); ``default``: the flag was left out."""
    text = value.strip().lower()
    if text in ("none", "unbounded"):
        return None
    if text == DEFAULT:
        return DEFAULT
    if text.endswith("%"):
        try:
            return ("headroom", float(text[:-1]) / 100)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"bad percentage {value!r}") from exc
    try:
        return ("bytes", nbytes_of(value))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"bad size {value!r}: use BYTES (256M), P% (10%) or none") from exc


def _sizes(text: str) -> list[int]:
    try:
        return [nbytes_of(s) for s in text.split(",") if s]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"bad size list {text!r}: {exc}") from exc


def _backends(text: str) -> list[str]:
    names = [b for b in text.split(",") if b]
    unknown = [b for b in names if b not in BACKENDS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown backend(s) {unknown}; known: {', '.join(BACKENDS)}")
    return names


def _knob(text: str) -> tuple[str, object]:
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    for parse in (int, float):
        try:
            return name, parse(value)
        except ValueError:
            pass
    return name, {"true": True, "false": False}.get(value.lower(), value)


def _suite_arguments(parser: argparse.ArgumentParser) -> None:
    from bunshin.envs.suites.registry import SUITES

    parser.add_argument("--suite", choices=sorted(SUITES), required=True)
    parser.add_argument("--catalog-size", type=int, help="web shop: products in the catalog (default 20000)")
    parser.add_argument("--set", type=_knob, action="append", default=[], metavar="KNOB=VALUE",
                        help="another keyword argument of the suite (e.g. image_px=48, cache_mb=120)")


def with_time_scale(args: argparse.Namespace, time_scale: float) -> None:
    """The suite's ``time_scale`` knob (its tools' modelled latency, ``envs/latency.py``) follows ``time_scale``
    unless the user set the knob (``--set time_scale=X``)."""
    if not any(name == "time_scale" for name, _ in args.set):
        args.set = [*args.set, ("time_scale", time_scale)]


def budgets(args: argparse.Namespace) -> dict[str, int | None]:
    """The prefix-cache budgets given on the command line (a flag left out keeps ``PrefixSettings``' default)."""
    return {name: getattr(args, name) for name in ("hot_budget", "disk_budget") if getattr(args, name) != DEFAULT}


def prefix_settings(args: argparse.Namespace) -> object:
    """``bunshin eval``'s prefix-cache flags as ``PrefixSettings`` (None without ``--prefix-cache``)."""
    from .prefix.settings import PrefixSettings

    given = [flag for flag, value in (("--cache-dir", args.cache_dir), ("--hot-budget", args.hot_budget),
                                      ("--disk-budget", args.disk_budget)) if value not in (None, DEFAULT)]
    if not args.prefix_cache:
        if given:
            raise SystemExit(f"bunshin eval: {', '.join(given)} need --prefix-cache")
        return None
    try:
        return PrefixSettings(cache_dir=args.cache_dir, strategy=args.cache_strategy, **budgets(args))
    except ValueError as exc:
        raise SystemExit(f"bunshin eval: {exc}") from exc


SPEC_FLAGS = (("--spec-slots", "spec_slots", None), ("--spec-threshold", "spec_threshold", None),
              ("--spec-memory", "spec_memory", DEFAULT), ("--spec-train", "spec_train", None),
              ("--spec-readonly", "spec_readonly", False))


def _refuse(args: argparse.Namespace, command: str, message: str) -> None:
    """An argparse error of ``command``'s own parser (usage, then the message; exit 2)."""
    parser = getattr(args, "subparser", None)
    if parser is not None:
        parser.error(message)
    raise SystemExit(f"{command}: {message}")


def spec_settings(args: argparse.Namespace, command: str = "bunshin eval") -> object:
    """The speculation flags as ``SpecSettings`` (a flag left out keeps its default). ``bunshin eval``: None
    without ``--speculate``, and a ``--spec-*`` flag without it is an error; with ``--prefix-cache --cache-dir
    DIR`` the selector is saved in DIR. ``bunshin bench epoch``: the speculating modes' settings (their
    ``read_only`` and ``model_dir`` are the mode's), and a ``--spec-*`` flag with no such mode is an error."""
    from .speculation.settings import SpecSettings

    given = [flag for flag, name, unset in SPEC_FLAGS if getattr(args, name, unset) != unset]
    if hasattr(args, "speculate"):
        if not args.speculate:
            if given:
                _refuse(args, command, f"{', '.join(given)} need{'s' if len(given) == 1 else ''} --speculate")
            return None
    elif given and not any(m in ("spec", "spec-readonly", "full") for m in args.modes):
        _refuse(args, command, f"{', '.join(given)} need a speculating mode (spec, spec-readonly or full)")
    if getattr(args, "spec_train", None) is not None and not args.spec_train.is_file():
        _refuse(args, command, f"--spec-train {args.spec_train}: no such file")
    kwargs: dict[str, object] = {}
    for key, name in (("slots", "spec_slots"), ("threshold", "spec_threshold"), ("train_file", "spec_train")):
        if getattr(args, name, None) is not None:
            kwargs[key] = getattr(args, name)
    memory = getattr(args, "spec_memory", DEFAULT)
    if memory != DEFAULT:
        kind, amount = memory if memory is not None else (None, None)
        kwargs["memory_headroom"] = amount if kind == "headroom" else None
        kwargs["memory_budget"] = int(amount) if kind == "bytes" else None  # type: ignore[arg-type]
    if getattr(args, "spec_readonly", False):
        kwargs["read_only"] = True
    if getattr(args, "prefix_cache", False) and getattr(args, "cache_dir", None) is not None:
        kwargs["model_dir"] = args.cache_dir
    try:
        return SpecSettings(**kwargs)
    except ValueError as exc:
        _refuse(args, command, str(exc))
        raise  # not reached: _refuse exits


def _spec_arguments(parser: argparse.ArgumentParser, bench: bool = False) -> None:
    need = "speculating modes" if bench else "with --speculate"
    parser.add_argument("--spec-slots", type=int, metavar="N",
                        help=f"{need}: speculative branches running at once, tail samples first (default 4)")
    parser.add_argument("--spec-threshold", type=float, metavar="P",
                        help=f"{need}: the probability the selector's first prediction must reach (default 0.5)")
    parser.add_argument("--spec-memory", type=spec_memory_of, default=DEFAULT, metavar="P%|BYTES",
                        help=f"{need}: memory for the branches: P%% lets them lift the run's memory at most P%% above "
                             "the most it has held without them (default 10%%), BYTES caps what they hold together "
                             "(256M), none: unbounded")
    parser.add_argument("--spec-train", type=Path, metavar="FILE",
                        help=f"{need}: recorded trajectories (JSON Lines, as eval's trajectories.jsonl) the "
                             "selector learns from before the first rollout")


def make_suite(args: argparse.Namespace) -> object:
    from bunshin.envs.suites.registry import get_suite

    knobs = dict(args.set)
    if args.catalog_size is not None:
        if args.suite != "webshop":
            raise SystemExit("--catalog-size is a web shop knob")
        knobs["catalog_size"] = args.catalog_size
    try:
        return get_suite(args.suite, **knobs)
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"bad knob for suite {args.suite}: {exc}") from exc


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bunshin", description="BunshinRL: rollouts on live forks of workspaces")
    sub = parser.add_subparsers(dest="command", required=True)

    doctor = sub.add_parser("doctor", help="what this host supports and which fork backends can run here")
    doctor.add_argument("--json", action="store_true", help="print JSON instead of a table")

    demo = sub.add_parser("demo", help="fork a live workspace a few times and show what it measured")
    demo.add_argument("--size", type=nbytes_of, default=nbytes_of("256M"))
    demo.add_argument("--clones", type=int, default=4)
    demo.add_argument("--backend", choices=BACKENDS, default="cow")

    ev = sub.add_parser("eval", help="roll out GRPO groups on a suite and write trajectories and a summary")
    _suite_arguments(ev)
    chosen = ev.add_mutually_exclusive_group()
    chosen.add_argument("--tasks", type=Path, help="a file of task ids, one a line (default: the suite's tasks)")
    chosen.add_argument("--task-dir", type=Path, metavar="DIR",
                        help="run the task files under DIR (every *.json, recursively: OSWorld's "
                             "evaluation_examples/examples, WebArena's config_files); the files the suite or the "
                             "policy refuses are listed with the reason, the rest run")
    ev.add_argument("--policy", default="scripted",
                    help="scripted | grounded | replay:PATH | openai:URL (default scripted)")
    ev.add_argument("--limit", type=int, default=None, help="only the first N tasks (after the refused ones)")
    ev.add_argument("--group-size", type=int, default=4, help="samples per task (a GRPO group)")
    ev.add_argument("--concurrency", type=int, default=8, help="rollouts at once")
    ev.add_argument("--memory-budget", type=nbytes_of, default=None, help="admit rollouts within this memory")
    ev.add_argument("--backend", choices=BACKENDS, default="cow")
    ev.add_argument("--time-scale", type=float, default=0.05,
                    help="multiply the policy's modelled reasoning time and the suite's modelled tool latency "
                         "(1 = real seconds; the suite's knob time_scale, unless --set time_scale=X)")
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--max-steps", type=int, default=40)
    ev.add_argument("--out", type=Path, required=True, help="directory for trajectories.jsonl and summary.json")
    ev.add_argument("--prefix-cache", action="store_true",
                    help="serve tool calls from a prefix tree of workspace snapshots (docs/prefix.md)")
    ev.add_argument("--cache-dir", type=Path, metavar="DIR",
                    help="with --prefix-cache: keep the tree and its checkpoints here across runs")
    ev.add_argument("--hot-budget", type=budget_of, default=DEFAULT, metavar="BYTES",
                    help="with --prefix-cache: memory for snapshots (default 256M; none: unbounded)")
    ev.add_argument("--disk-budget", type=budget_of, default=DEFAULT, metavar="BYTES",
                    help="with --prefix-cache: disk for checkpoints (default 8G; none: unbounded)")
    ev.add_argument("--cache-strategy", choices=["lru", "cost"], default="lru",
                    help="with --prefix-cache: what to evict first (least recently used, or cost-aware)")
    ev.add_argument("--speculate", action="store_true",
                    help="run predicted tool calls in forks while the policy reasons, adopt a branch whose call "
                         "matches (with --prefix-cache --cache-dir DIR the selector is saved in DIR)")
    _spec_arguments(ev)
    ev.add_argument("--ray", metavar="ADDRESS",
                    help="run the same job on a Ray cluster: one node agent per node (--concurrency and "
                         "--memory-budget are per node); ADDRESS as ray.init(address=...) takes it (auto, "
                         "ray://host:10001, host:6379), or local:N for N simulated nodes on this machine")
    ev.add_argument("--spec-readonly", action="store_true",
                    help="with --speculate: speculate only calls the suite declares read-only (for comparison)")
    ev.set_defaults(subparser=ev)

    rp = sub.add_parser("replay", help="re-execute recorded trajectories in fresh workspaces and compare")
    rp.add_argument("trajectories", type=Path)
    rp.add_argument("--backend", choices=BACKENDS, default="cow")
    rp.add_argument("--concurrency", type=int, default=8)
    rp.add_argument("--catalog-size", type=int, help="web shop: as the recording was made")
    rp.add_argument("--set", type=_knob, action="append", default=[], metavar="KNOB=VALUE")
    rp.add_argument("--json", type=Path, help="write the comparison as JSON here")

    suite = sub.add_parser("suite", help="the embedded task suites")
    suite_sub = suite.add_subparsers(dest="suite_command", required=True)
    check = suite_sub.add_parser("check", help="run every task's reference solution and a null attempt")
    _suite_arguments(check)
    check.add_argument("--json", type=Path, help="write the report as JSON here")
    check.add_argument("--limit", type=int, help="only the first N tasks")
    check.add_argument("--concurrency", type=int, default=2)

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    fork = bench_sub.add_parser("fork", help="freeze window, fork-to-ready and clone memory by size and backend")
    fork.add_argument("--sizes", type=_sizes, default=_sizes("64M,256M,1G"))
    fork.add_argument("--backends", type=_backends, default=["cow", "restore"])
    fork.add_argument("--forks", type=int, default=10, help="forks per backend and size")
    fork.add_argument("--json", type=Path, help="write results as JSON here")
    fork.add_argument("--plot", type=Path, help="write a PNG plot here")
    mem = bench_sub.add_parser("memory", help="peak and total memory as concurrent rollouts grow, per backend")
    _suite_arguments(mem)
    mem.add_argument("--rollouts", type=lambda t: [int(x) for x in t.split(",") if x], default=[8, 16, 32, 64])
    mem.add_argument("--backends", type=_backends, default=["cow", "restore"])
    mem.add_argument("--group-size", type=int, default=8)
    mem.add_argument("--time-scale", type=float, default=0.3,
                     help="scripted policy reasoning and suite tool latency time scale (unless --set time_scale=X)")
    mem.add_argument("--seed", type=int, default=0)
    mem.add_argument("--repeat", type=int, default=1, help="run everything K times: medians and ranges")
    mem.add_argument("--json", type=Path, help="write results as JSON here")
    mem.add_argument("--plot", type=Path, help="write a PNG plot here")

    sharing = bench_sub.add_parser("sharing", help="identical and shared memory of the samples of one task, per step")
    _suite_arguments(sharing)
    sharing.add_argument("--steps", type=int, default=10)
    sharing.add_argument("--samples", type=int, default=2, help="samples forked per task (a GRPO group)")
    sharing.add_argument("--template", default="all", help="NAME or all (default): whose tasks are measured")
    sharing.add_argument("--tasks-per-template", type=int, help="only the first M tasks of each template")
    sharing.add_argument("--policy", choices=["grounded", "scripted"], default="grounded",
                         help="what drives the samples, at reasoning time scale 0 (default grounded)")
    sharing.add_argument("--detour-p", type=float, help="the policy's detour probability (default: its own)")
    sharing.add_argument("--seed", type=int, default=0, help="the run seed the sample seeds derive from")
    sharing.add_argument("--json", type=Path, help="write results as JSON here")
    sharing.add_argument("--plot", type=Path, help="write a PNG plot here")

    from .bench import graft as bench_graft

    graft = bench_sub.add_parser("graft", help="the kernel module's graft against fork() of the same source, in "
                                               "a QEMU VM (kmod/vmtest)")
    bench_graft.add_arguments(graft)

    from .bench import selector as bench_selector

    sel = bench_sub.add_parser("selector", help="the Spec Tool Selector's accuracy on recorded epochs, per detour "
                                                "rate and feature group")
    _suite_arguments(sel)
    bench_selector.add_arguments(sel)

    from .bench import scale as bench_scale

    sc = bench_sub.add_parser("scale", help="rollouts per second and memory per node on 1, 2, 3... Ray nodes "
                                            "(simulated on this machine: ratios only), and the cost of a Ray hop")
    _suite_arguments(sc)
    bench_scale.add_arguments(sc)

    ep = bench_sub.add_parser("epoch", help="wall time, tool-seconds and memory of epochs of GRPO groups, per mode")
    _suite_arguments(ep)
    ep.add_argument("--epochs", type=int, default=3)
    ep.add_argument("--modes", type=lambda t: [m for m in t.split(",") if m],
                    default=["base", "spec", "spec-readonly", "prefix", "full"],
                    help="base (every call executed), spec (speculative tool execution), spec-readonly "
                         "(speculating read-only calls only), prefix (the prefix cache), full (prefix cache and "
                         "speculation); the first is the ratios' reference (default base,spec,spec-readonly,"
                         "prefix,full)")
    ep.add_argument("--policy", choices=["grounded", "scripted"], default="grounded")
    ep.add_argument("--detour-p", type=float, metavar="P",
                    help="the policy's detour probability (default: its own, 0.15; the issue's selector "
                         "accuracy is reported at 0, 0.15 and 0.3)")
    ep.add_argument("--tasks", type=int, default=10, help="groups per epoch: one task each, across templates")
    ep.add_argument("--group-size", type=int, default=6,
                    help="samples per task (a GRPO group; default 6: the five modes' three epochs in 10 minutes on "
                         "two cores)")
    ep.add_argument("--concurrency", type=int, default=16, help="rollouts at once")
    ep.add_argument("--time-scale", type=float, default=0.2,
                    help="the policy's reasoning time and the suite's tool latency (1 = as modelled)")
    ep.add_argument("--seed", type=int, default=0, help="epoch e runs with run seed SEED + e, in every mode")
    ep.add_argument("--backend", choices=BACKENDS, default="cow")
    ep.add_argument("--max-steps", type=int, default=40)
    ep.add_argument("--cache-dir", default="none",
                    help="prefix and full modes: the caches' directory, each mode in its own subdirectory, full's "
                         "selector beside its cache (default none: in memory only, as --prefix-cache without "
                         "--cache-dir; temp: a fresh temporary one, removed afterwards)")
    ep.add_argument("--hot-budget", type=budget_of, default=DEFAULT,
                    help="prefix and full modes: bytes of snapshots in memory (default: --prefix-cache's, 256M; "
                         "none: unbounded)")
    ep.add_argument("--disk-budget", type=budget_of, default=DEFAULT,
                    help="prefix and full modes: bytes of checkpoints on disk (default: --prefix-cache's, 8G)")
    ep.add_argument("--strategy", choices=["lru", "cost"], default="lru",
                    help="prefix and full modes: eviction strategy")
    _spec_arguments(ep, bench=True)
    ep.add_argument("--json", type=Path, help="write every mode's epochs as JSON here")
    ep.add_argument("--plots", type=Path, help="write the PNG plots (rollouts running, working set) into this "
                                                "directory")
    ep.set_defaults(subparser=ep)
    return parser


@contextlib.contextmanager
def ray_cluster(address: str | None) -> Iterator[str | None]:
    """``--ray``: the address to give ``ray.init`` (None without ``--ray``); ``local:N`` starts N simulated nodes on
    this machine for the command's duration (``engine/cluster/local.py``)."""
    if address is None:
        yield None
        return
    from bunshin.engine.cluster.local import LocalClusterError, local_cluster, parse_local

    try:
        import ray  # noqa: F401
    except ImportError as exc:
        raise SystemExit(f"--ray needs Ray installed (pip install 'ray[default]'): {exc}") from exc
    try:
        nodes = parse_local(address)
    except LocalClusterError as exc:
        raise SystemExit(f"bunshin: {exc}") from exc
    if nodes is None:
        yield address
        return
    with local_cluster(nodes) as cluster:
        yield cluster.address


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "doctor":
        from bunshin.envs.runtime.doctor import diagnose

        report = diagnose()
        if args.json:
            print(json.dumps(report.to_json(), indent=2))
            return 0
        for c in report.checks:
            print(f"{'ok ' if c.ok else 'no '} {c.name:26} {c.detail}")
        print()
        for name, (ok, detail) in report.backends.items():
            print(f"backend {name:8} {'available' if ok else 'unavailable':12} {detail}")
        return 0
    if args.command == "demo":
        from .commands.demo import demo

        return event_loop.run(demo(args.size, args.clones, args.backend))
    if args.command == "bench" and args.bench == "fork":
        from .bench import fork as bench_fork

        return event_loop.run(bench_fork.run(args.sizes, args.backends, args.forks, args.json, args.plot)) and 0
    if args.command == "bench" and args.bench == "memory":
        from .bench import memory as bench_memory

        with_time_scale(args, args.time_scale)
        return event_loop.run(bench_memory.main(make_suite(args), args.rollouts, args.backends, args.group_size,
                                          args.time_scale, args.seed, args.json, args.plot, args.repeat))
    if args.command == "bench" and args.bench == "sharing":
        from .bench import sharing as bench_sharing

        try:
            policy = bench_sharing.make_bench_policy(args.policy, args.detour_p)
        except (ValueError, ImportError) as exc:
            raise SystemExit(f"bunshin bench sharing: --policy: {exc}") from exc
        with_time_scale(args, 0.0)  # pages are measured per step: waiting would change nothing but the wall time
        return event_loop.run(bench_sharing.main(
            make_suite(args), policy, args.steps, samples=args.samples, template=args.template,
            per_template=args.tasks_per_template, seed=args.seed, json_path=args.json, plot_path=args.plot))
    if args.command == "bench" and args.bench == "graft":
        from .bench import graft as bench_graft

        return bench_graft.command(args)
    if args.command == "bench" and args.bench == "selector":
        from .bench import selector as bench_selector

        return bench_selector.command(args, make_suite)
    if args.command == "bench" and args.bench == "scale":
        from .bench import scale as bench_scale

        with_time_scale(args, args.time_scale)
        return bench_scale.command(args, make_suite)
    if args.command == "bench" and args.bench == "epoch":
        from .bench import epoch as bench_epoch

        return bench_epoch.command(args, make_suite)
    if args.command == "eval":
        from bunshin.policies.registry import make_policy

        from .commands.eval_command import run_eval

        prefix, speculation = prefix_settings(args), spec_settings(args)
        try:
            policy = make_policy(args.policy, args.time_scale)
        except (ValueError, OSError) as exc:
            raise SystemExit(f"bunshin eval: --policy: {exc}") from exc
        if args.task_dir is not None:
            if not args.task_dir.is_dir():
                raise SystemExit(f"bunshin eval: --task-dir {args.task_dir}: not a directory")
            if any(name in ("tasks_dir", "lenient") for name, _ in args.set):
                raise SystemExit("bunshin eval: --task-dir sets the suite's tasks_dir and lenient knobs itself")
            args.set = [*args.set, ("tasks_dir", str(args.task_dir)), ("lenient", True)]
        with_time_scale(args, args.time_scale)
        from bunshin.policies.base import PolicyError

        try:
            with ray_cluster(args.ray) as address:
                summary = event_loop.run(run_eval(make_suite(args), policy, args.out, tasks_file=args.tasks,
                                                  limit=args.limit, group_size=args.group_size,
                                                  concurrency=args.concurrency, memory_budget=args.memory_budget,
                                                  backend=args.backend, seed=args.seed, max_steps=args.max_steps,
                                                  prefix=prefix, speculation=speculation, ray_address=address))
        except PolicyError as exc:  # the preflight, or a model server not set up for the policy: the run's failure
            raise SystemExit(f"bunshin eval: {args.policy}: {type(exc).__name__}: {exc}") from exc
        print(f"wrote {args.out / 'trajectories.jsonl'} and {args.out / 'summary.json'}")
        return 0 if summary["rollouts"] else 1
    if args.command == "replay":
        from .bench.report import write_json
        from .commands.replay_command import run_replay
        from .records import read_jsonl

        first = next(read_jsonl(args.trajectories), None)
        if first is None:
            raise SystemExit(f"{args.trajectories}: no trajectories")
        args.suite = first.suite
        report = event_loop.run(run_replay(make_suite(args), args.trajectories, backend=args.backend,
                                     concurrency=args.concurrency))
        print(json.dumps({k: v for k, v in report.items() if k != "differences"}))
        if args.json:
            write_json(args.json, report)
        ok = report["identical_observations"] == report["identical_rewards"] == report["trajectories"]
        return 0 if ok else 1
    if args.command == "suite" and args.suite_command == "check":
        from .bench.report import write_json
        from .commands.suite_check import check as check_suite

        report = event_loop.run(check_suite(make_suite(args), limit=args.limit, concurrency=args.concurrency))
        print(json.dumps({k: v for k, v in report.items() if k != "failures"}))
        for failure in report["failures"]:
            print(f"FAILED task {failure['task']} ({failure['template']}) {failure['attempt']}: {failure['reason']}")
        if args.json:
            write_json(args.json, report)
        return 0 if report["oracle_pass"] == report["tasks"] and not report["failures"] else 1
    return 2


if __name__ == "__main__":
    sys.exit(main())

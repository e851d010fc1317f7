"""The ``bunshin`` command line: ``doctor``, ``demo``, ``eval``, ``replay``, ``suite check``, ``bench fork``,
``bench memory``, ``bench sharing``, ``bench epoch``, ``bench selector``, ``bench scale``, ``bench graft``,
``bench treefork``.

Owns: the parser and the dispatch; every command's work lives in its own module (``commands/``, ``bench/``), the
flags several share in ``commands/flags.py``. ``main`` is the one place an error becomes an exit status.
Must never: be imported by the library (only the entry point and tests import it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

from bunshin.envs.images.docker_roots import DockerError
from bunshin.envs.runtime.fork.registry import BACKENDS

from . import event_loop
from .commands.flags import (
    DEFAULT,
    browser_argument,
    budget_of,
    deployment_arguments,
    hot_budget_of,
    image_argument,
    knob,
    make_suite,
    nbytes_of,
    prefix_settings,
    spec_arguments,
    spec_settings,
    suite_arguments,
    warm_pool_argument,
    with_time_scale,
)
from .errors import ArgumentRefused, BadRequest, CommandError

T = TypeVar("T")


def _sizes(text: str) -> list[int]:
    try:
        return [nbytes_of(s) for s in text.split(",") if s]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"bad size list {text!r}: {exc}") from exc


def _pages(text: str) -> tuple[str, ...]:
    from .bench.fork import PAGES

    pages = tuple(p for p in text.split(",") if p)
    unknown = [p for p in pages if p not in PAGES]
    if unknown or not pages:
        raise argparse.ArgumentTypeError(f"bad page list {text!r}: each one of {', '.join(PAGES)}")
    return pages


def _counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"bad count list {text!r}: {exc}") from exc
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"bad count list {text!r}: counts of at least 1")
    return counts


def _backends(text: str) -> list[str]:
    names = [b for b in text.split(",") if b]
    unknown = [b for b in names if b not in BACKENDS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown backend(s) {unknown}; known: {', '.join(BACKENDS)}")
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bunshin", description="BunshinRL: rollouts on live forks of workspaces")
    sub = parser.add_subparsers(dest="command", required=True)

    doctor = sub.add_parser("doctor", help="what this host supports and which fork backends can run here")
    doctor.add_argument("--json", action="store_true", help="print JSON instead of a table")

    model = sub.add_parser("model", help="a tiny real model (SmolLM2-135M-Instruct) behind llama.cpp's "
                                         "OpenAI-compatible server (docs/policies.md)")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    model_sub.add_parser("setup", help="build the portable llama.cpp wheel once, install it, unpack the model "
                                       "(idempotent; offline once done)")
    model_serve = model_sub.add_parser("serve", help="set up if needed, then serve the model until interrupted")
    model_serve.add_argument("--port", type=int, default=8000)

    images = sub.add_parser("images", help="the declared workspace images: build them, list them (docs/images.md)")
    images_sub = images.add_subparsers(dest="images_command", required=True)
    images_build = images_sub.add_parser("build", help="build declared images that are not built yet (as root: "
                                         "mmdebstrap from the Debian archive, a minute or a few each)")
    images_build.add_argument("names", nargs="*", help="image names (bunshin images list shows them)")
    images_build.add_argument("--all", action="store_true", help="every declared image")
    images_sub.add_parser("list", help="every declared image: built or not, what it holds, where")
    images_docker = images_sub.add_parser("docker", help="import built images into the local Docker daemon as "
                                          "bunshin/NAME:DIGEST, for --image docker:... (docs/docker.md)")
    images_docker.add_argument("names", nargs="*", help="image names (default: every built one)")
    images_sub.add_parser("prune", help="remove built images no declared recipe names any more (older recipes')")

    demo = sub.add_parser("demo", help="fork a live workspace a few times and show what it measured")
    demo.add_argument("--size", type=nbytes_of, default=nbytes_of("256M"))
    demo.add_argument("--clones", type=int, default=4)
    demo.add_argument("--backend", choices=BACKENDS, default="cow")

    ev = sub.add_parser("eval", help="roll out GRPO groups on a suite and write trajectories and a summary")
    suite_arguments(ev)
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
    warm_pool_argument(ev)
    ev.add_argument("--backend", choices=BACKENDS, default="cow")
    image_argument(ev)
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
    ev.add_argument("--hot-budget", type=hot_budget_of, default=DEFAULT, metavar="BYTES|SHARE%",
                    help="with --prefix-cache: memory for snapshots (default 256M; none: unbounded; 10%%: a tenth "
                         "of the most the run has held without them)")
    ev.add_argument("--disk-budget", type=budget_of, default=DEFAULT, metavar="BYTES",
                    help="with --prefix-cache: disk for checkpoints (default 8G; none: unbounded)")
    ev.add_argument("--cache-strategy", choices=["lru", "cost"], default="lru",
                    help="with --prefix-cache: what to evict first (least recently used, or cost-aware)")
    ev.add_argument("--speculate", action="store_true",
                    help="run predicted tool calls in forks while the policy reasons, adopt a branch whose call "
                         "matches (with --prefix-cache --cache-dir DIR the selector is saved in DIR)")
    spec_arguments(ev)
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
    image_argument(rp)
    rp.add_argument("--concurrency", type=int, default=8)
    rp.add_argument("--catalog-size", type=int, help="web shop: as the recording was made")
    rp.add_argument("--set", type=knob, action="append", default=[], metavar="KNOB=VALUE")
    browser_argument(rp)
    rp.add_argument("--json", type=Path, help="write the comparison as JSON here")

    suite = sub.add_parser("suite", help="the embedded task suites")
    suite_sub = suite.add_subparsers(dest="suite_command", required=True)
    check = suite_sub.add_parser("check", help="run every task's reference solution and a null attempt")
    suite_arguments(check)
    check.add_argument("--json", type=Path, help="write the report as JSON here")
    check.add_argument("--limit", type=int, help="only the first N tasks")
    check.add_argument("--concurrency", type=int, default=2)
    check.add_argument("--task-dir", type=Path, metavar="DIR",
                       help="check the task files under DIR (every *.json, recursively; e.g. OSWorld's "
                            "evaluation_examples/examples): refused files are listed with the reason; a task "
                            "without a reference solution runs its null attempt only")

    webarena = sub.add_parser("webarena", help="WebArena's own tasks on a deployment of its sites (docs/webarena.md)")
    webarena_sub = webarena.add_subparsers(dest="webarena_command", required=True)
    wa_tasks = webarena_sub.add_parser("tasks", help="which tasks of a WebArena task file the sites given can run, "
                                                     "by site and evaluator; refused ones with the reason")
    deployment_arguments(wa_tasks)
    wa_tasks.add_argument("--refusals", action="store_true", help="list every refused task with its reason")
    wa_tasks.add_argument("--json", type=Path, help="write the counts as JSON here")

    files = sub.add_parser("files", help="the files cache OSWorld tasks download from (the osworld suite)")
    files_sub = files.add_subparsers(dest="files_command", required=True)
    add = files_sub.add_parser("add", help="keep FILE as what URL gives (a task's download or cloud file)")
    add.add_argument("url")
    add.add_argument("file", type=Path)
    add.add_argument("--files-cache", type=Path, metavar="DIR", default=None,
                     help="default $BUNSHIN_FILES_CACHE or /var/lib/bunshin/files")

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    fork = bench_sub.add_parser("fork", help="freeze window, fork-to-ready and clone memory by size and backend")
    fork.add_argument("--sizes", type=_sizes, default=_sizes("64M,256M,1G"))
    fork.add_argument("--backends", type=_backends, default=["cow", "restore"])
    fork.add_argument("--forks", type=int, default=10, help="forks per backend and size")
    fork.add_argument("--pages", type=_pages, default=("huge",),
                      help="the heap's pages: huge (advised THP, as the apps' heaps are), 4k (an application that "
                           "does not advise its memory), or both: huge,4k")
    fork.add_argument("--peer", choices=["sandlock"], default=None,
                      help="also fork the same heap with Sandlock's process fork (pip package sandlock), in the same "
                           "run: ratios cow/peer")
    fork.add_argument("--two-step", action="store_true",
                      help="also the cow backend forking in two steps, as before one-step clones (rows cow-2step): "
                           "ratios cow/cow-2step")
    fork.add_argument("--no-shells", action="store_true",
                      help="also the cow backend without prepared shells, each fork making its clone's cgroup and "
                           "namespaces on its path (rows cow-noshell): ratios cow/cow-noshell")
    fork.add_argument("--json", type=Path, help="write results as JSON here")
    fork.add_argument("--plot", type=Path, help="write a PNG plot here")
    fork.add_argument("--browser", choices=["chromium"], default=None,
                      help="instead: a web-shop workspace with Chromium, forked live with a warm-pool slot, live "
                           "without one, and restored privately (--forks rounds each; --sizes and --backends do "
                           "not apply)")
    fork.add_argument("--modes", type=lambda t: [m for m in t.split(",") if m], default=None,
                      help="with --browser chromium: cow+pool,cow,restore (default all three)")
    fork.add_argument("--catalog-size", type=int, default=2000, help="with --browser chromium: the shop's catalog")
    mem = bench_sub.add_parser("memory", help="peak and total memory as concurrent rollouts grow, per backend")
    suite_arguments(mem)
    mem.add_argument("--rollouts", type=lambda t: [int(x) for x in t.split(",") if x], default=[8, 16, 32, 64])
    mem.add_argument("--backends", type=_backends, default=["cow", "restore"])
    mem.add_argument("--group-size", type=int, default=8)
    mem.add_argument("--time-scale", type=float, default=0.3,
                     help="scripted policy reasoning and suite tool latency time scale (unless --set time_scale=X)")
    mem.add_argument("--seed", type=int, default=0)
    mem.add_argument("--repeat", type=int, default=1, help="run everything K times: medians and ranges")
    mem.add_argument("--compare-ksm", action="store_true",
                     help="web shop with Chromium: run every backend a second time with KSM on (the suite's ksm "
                          "knob), in the same repeat")
    warm_pool_argument(mem)
    mem.add_argument("--json", type=Path, help="write results as JSON here")
    mem.add_argument("--plot", type=Path, help="write a PNG plot here")

    steps = bench_sub.add_parser("steps", help="the web shop's per-step latency: Chromium against the text browser")
    steps.add_argument("--catalog-size", type=int, default=2000)
    steps.add_argument("--tasks", type=int, default=1, help="tasks of every template (default 1)")
    steps.add_argument("--repeat", type=int, default=3, help="times every task is played (default 3)")
    steps.add_argument("--no-screenshots", action="store_true",
                       help="observations without the viewport PNG (the tree, URL and tabs only)")
    steps.add_argument("--json", type=Path, help="write results as JSON here")
    steps.add_argument("--plot", type=Path, help="write a PNG plot here")

    desk = bench_sub.add_parser("desktop", help="a real desktop workspace: start-up, memory, observations, actions, "
                                "and memory of 4, 8, 16 at once (docs/osworld.md)")
    desk.add_argument("--repeat", type=int, default=3, help="desktops measured one at a time (default 3)")
    desk.add_argument("--calls", type=int, default=10, help="calls of each observation and action (default 10)")
    desk.add_argument("--concurrency", type=_counts, default=[4, 8, 16], help="desktops at once (default 4,8,16)")
    desk.add_argument("--window", type=float, default=10.0, help="seconds of memory samples once all are up")
    desk.add_argument("--json", type=Path, help="write results as JSON here")
    desk.add_argument("--plot", type=Path, help="write a PNG plot here")

    sharing = bench_sub.add_parser("sharing", help="identical and shared memory of the samples of one task, per step")
    suite_arguments(sharing)
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

    from .bench import docker as bench_docker

    docker = bench_sub.add_parser("docker", help="workspaces from a Docker image: our live fork on it against "
                                                 "Docker as the runtime (fresh container + restore), +- KSM")
    bench_docker.add_arguments(docker)

    from .bench import graft as bench_graft

    graft = bench_sub.add_parser("graft", help="the kernel module's graft against fork() of the same source, in "
                                               "a QEMU VM (kmod/vmtest)")
    bench_graft.add_arguments(graft)

    from .bench import treefork as bench_treefork

    tree = bench_sub.add_parser("treefork", help="the tree fork against CRIU 3.17 and a cold start of real "
                                                 "workloads (Chromium, an X desktop), in a QEMU VM (kmod/vmtest)")
    bench_treefork.add_arguments(tree)

    from .bench import selector as bench_selector

    sel = bench_sub.add_parser("selector", help="the Spec Tool Selector's accuracy on recorded epochs, per detour "
                                                "rate and feature group")
    suite_arguments(sel)
    bench_selector.add_arguments(sel)

    from .bench import scale as bench_scale

    sc = bench_sub.add_parser("scale", help="rollouts per second and memory per node on 1, 2, 3... Ray nodes "
                                            "(simulated on this machine: ratios only), and the cost of a Ray hop")
    suite_arguments(sc)
    bench_scale.add_arguments(sc)

    ep = bench_sub.add_parser("epoch", help="wall time, tool-seconds and memory of epochs of GRPO groups, per mode")
    suite_arguments(ep)
    ep.add_argument("--epochs", type=int, default=3)
    ep.add_argument("--modes", type=lambda t: [m for m in t.split(",") if m],
                    default=["base", "spec", "spec-readonly", "prefix", "full"],
                    help="base (every call executed), spec (speculative tool execution), spec-readonly "
                         "(speculating read-only calls only), prefix (the prefix cache), full (prefix cache and "
                         "speculation); the first is the ratios' reference (default base,spec,spec-readonly,"
                         "prefix,full)")
    ep.add_argument("--policy", choices=["grounded", "scripted"], default="grounded")
    ep.add_argument("--detour-p", type=float, metavar="P",
                    help="the policy's detour probability (default: its own, 0.15; the selector "
                         "accuracy is reported at 0, 0.15 and 0.3)")
    ep.add_argument("--tasks", type=int, default=3,
                    help="groups per epoch: one task each, across templates (default 3: at time scale 1 the five "
                         "modes' three epochs of the web shop take about 13 minutes on two cores)")
    ep.add_argument("--group-size", type=int, default=6, help="samples per task (a GRPO group)")
    ep.add_argument("--concurrency", type=int, default=16, help="rollouts at once")
    ep.add_argument("--time-scale", type=float, default=1.0,
                    help="the policy's reasoning time and the suite's tool latency (default 1: as modelled, so a "
                         "fork costs what it costs next to the tools' real latency; below 1 a benchmark "
                         "understates what speculation and the cache hide)")
    ep.add_argument("--seed", type=int, default=0, help="epoch e runs with run seed SEED + e, in every mode")
    ep.add_argument("--backend", choices=BACKENDS, default="cow")
    ep.add_argument("--max-steps", type=int, default=40)
    ep.add_argument("--cache-dir", default="none",
                    help="prefix and full modes: the caches' directory, each mode in its own subdirectory, full's "
                         "selector beside its cache (default none: in memory only, as --prefix-cache without "
                         "--cache-dir; temp: a fresh temporary one, removed afterwards)")
    ep.add_argument("--hot-budget", type=hot_budget_of, default=DEFAULT,
                    help="prefix and full modes: bytes of snapshots in memory (default: --prefix-cache's, 256M; "
                         "none: unbounded; 10%%: a share of the most the run has held without them)")
    ep.add_argument("--disk-budget", type=budget_of, default=DEFAULT,
                    help="prefix and full modes: bytes of checkpoints on disk (default: --prefix-cache's, 8G)")
    ep.add_argument("--strategy", choices=["lru", "cost"], default="lru",
                    help="prefix and full modes: eviction strategy")
    spec_arguments(ep, bench=True)
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
        raise CommandError(f"--ray needs Ray installed (pip install 'ray[default]'): {exc}") from exc
    try:
        nodes = parse_local(address)
    except LocalClusterError as exc:
        raise CommandError(f"bunshin: {exc}") from exc
    if nodes is None:
        yield address
        return
    with local_cluster(nodes) as cluster:
        yield cluster.address


def main(argv: list[str] | None = None) -> int:
    """The entry point: parse ``argv``, run the command, return its exit status. The one place a refusal becomes an
    exit: an ``ArgumentRefused`` as argparse's own errors (usage, status 2), any other ``CommandError`` as its message
    on stderr and status 1; a Docker daemon that does not answer or lacks an image (``DockerError``) likewise."""
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except ArgumentRefused as exc:
        parser = getattr(args, "subparser", None)
        if parser is not None:
            parser.error(exc.reason)
        raise SystemExit(str(exc)) from exc
    except CommandError as exc:
        raise SystemExit(str(exc)) from exc
    except DockerError as exc:  # no daemon, an image it lacks: the machine's state, named, not a crash of ours
        raise SystemExit(f"bunshin {args.command}: {type(exc).__name__}: {exc}") from exc


async def closing(policy: Any, work: Coroutine[Any, Any, T]) -> T:
    """``work``, then the policy's ``close`` (a model server's HTTP session), inside the run's event loop."""
    try:
        return await work
    finally:
        await policy.close()


def run(args: argparse.Namespace) -> int:
    """Run the command ``args`` names; a refusal is a ``CommandError``."""
    if args.command == "doctor":
        from bunshin.envs.runtime.doctor import diagnose

        from .commands.images import images_json, suites_table
        from .commands.images import table as images_table

        diagnosis = diagnose()
        if args.json:
            print(json.dumps({**diagnosis.to_json(), **images_json()}, indent=2))
            return 0
        for c in diagnosis.checks:
            print(f"{'ok ' if c.ok else 'no '} {c.name:26} {c.detail}")
        print()
        for name, (ok, detail) in diagnosis.backends.items():
            print(f"backend {name:8} {'available' if ok else 'unavailable':12} {detail}")
        print()
        for line in images_table() + suites_table():
            print(line)
        return 0
    if args.command == "model":
        from bunshin.policies import local_model

        from .commands.images import progress

        try:
            if args.model_command == "setup":
                print(local_model.set_up(progress))
                return 0
            def stop(signum: int, frame: object) -> None:
                raise KeyboardInterrupt  # a SIGTERM stops the server as Ctrl-C does, through the context's exit

            signal.signal(signal.SIGTERM, stop)
            with local_model.serving(progress, port=args.port) as server:
                print(f"serving {local_model.MODEL_ALIAS} at {server.url} (Ctrl-C stops it)", flush=True)
                with contextlib.suppress(KeyboardInterrupt):
                    while server.proc is not None and server.proc.poll() is None:
                        time.sleep(1)
            return 0
        except local_model.ModelSetupFailed as exc:
            raise CommandError(f"bunshin model {args.model_command}: {exc}") from exc
    if args.command == "images":
        from bunshin.envs.images.recipes import RECIPES

        from .commands import images as images_command

        if args.images_command == "list":
            for line in images_command.table():
                print(line)
            return 0
        if args.images_command == "docker":
            from bunshin.envs.images.store import ImageStore

            store = ImageStore()
            names = args.names or [name for name, wanted in sorted(RECIPES.items()) if store.find(wanted)]
            for ref in event_loop.run(images_command.to_docker(names)):
                print(ref)
            return 0
        if args.images_command == "prune":
            for name in images_command.prune():
                print(f"removed {name}")
            return 0
        if args.all == bool(args.names):
            raise CommandError("bunshin images build: name the images, or --all")
        images_command.build(sorted(RECIPES) if args.all else args.names)
        for line in images_command.table():
            print(line)
        return 0
    if args.command == "demo":
        from .commands.demo import demo

        return event_loop.run(demo(args.size, args.clones, args.backend))
    if args.command == "bench" and args.bench == "fork":
        if args.browser == "chromium":
            from bunshin.envs.webshop.suite import WebShopSuite

            from .bench import browser_fork
            from .commands.images import ensure_suite_images

            suite = WebShopSuite(catalog_size=args.catalog_size, time_scale=0.0, browser="chromium")
            ensure_suite_images(suite)
            event_loop.run(browser_fork.run(suite, args.forks, args.modes or list(browser_fork.MODES), args.json,
                                            args.plot))
            return 0
        if args.modes is not None:
            raise CommandError("bench fork: --modes needs --browser chromium")
        from .bench import fork as bench_fork

        event_loop.run(bench_fork.run(args.sizes, args.backends, args.forks, args.json, args.plot, args.pages,
                                      args.peer, args.two_step, args.no_shells))
        return 0
    if args.command == "bench" and args.bench == "memory":
        from .bench import memory as bench_memory

        with_time_scale(args, args.time_scale)
        ksm_suite = None
        if args.compare_ksm:
            if dict(args.set).get("ksm") is not None or args.ksm is not None:
                raise CommandError("--compare-ksm runs both: leave out --ksm and --set ksm=")
            args.ksm = "on"
            ksm_suite = make_suite(args)
            args.ksm = None
        return event_loop.run(bench_memory.main(make_suite(args), args.rollouts, args.backends, args.group_size,
                                          args.time_scale, args.seed, args.json, args.plot, args.repeat,
                                          ksm_suite=ksm_suite, warm_pool=args.warm_pool))
    if args.command == "bench" and args.bench == "steps":
        from .bench import browser_steps

        if args.tasks < 1 or args.repeat < 1:
            raise CommandError("bench steps: --tasks and --repeat are counts of at least 1")
        from bunshin.envs.webshop.suite import WebShopSuite

        from .commands.images import ensure_suite_images

        for browser in ("text", "chromium"):  # the two it compares
            ensure_suite_images(WebShopSuite(catalog_size=1, browser=browser))
        event_loop.run(browser_steps.run(args.catalog_size, args.tasks, args.repeat, not args.no_screenshots,
                                         args.json, args.plot))
        return 0
    if args.command == "bench" and args.bench == "desktop":
        from .bench import desktop as bench_desktop
        from .commands.images import build as build_images

        if args.repeat < 1 or args.calls < 1:
            raise CommandError("bench desktop: --repeat and --calls are counts of at least 1")
        build_images(["desktop"])
        event_loop.run(bench_desktop.run(args.repeat, args.calls, args.concurrency, args.window, args.json,
                                         args.plot))
        return 0
    if args.command == "bench" and args.bench == "sharing":
        from .bench import sharing as bench_sharing
        from .bench.policy import bench_policy

        try:
            policy = bench_policy(args.policy, 0.0, args.detour_p)
        except BadRequest as exc:
            raise CommandError(f"bunshin bench sharing: --policy: {exc}") from exc
        with_time_scale(args, 0.0)  # pages are measured per step: waiting would change nothing but the wall time
        return event_loop.run(bench_sharing.main(
            make_suite(args), policy, args.steps, samples=args.samples, template=args.template,
            per_template=args.tasks_per_template, seed=args.seed, json_path=args.json, plot_path=args.plot))
    if args.command == "bench" and args.bench == "docker":
        from .bench import docker as bench_docker

        return bench_docker.command(args)
    if args.command == "bench" and args.bench == "graft":
        from .bench import graft as bench_graft

        return bench_graft.command(args)
    if args.command == "bench" and args.bench == "treefork":
        from .bench import treefork as bench_treefork

        return bench_treefork.command(args)
    if args.command == "bench" and args.bench == "selector":
        from .bench import selector as bench_selector

        return bench_selector.command(args)
    if args.command == "bench" and args.bench == "scale":
        from .bench import scale as bench_scale

        with_time_scale(args, args.time_scale)
        return bench_scale.command(args)
    if args.command == "bench" and args.bench == "epoch":
        from .bench import epoch as bench_epoch

        return bench_epoch.command(args)
    if args.command in ("eval", "replay") and args.runtime == "docker" and args.backend != "cow":
        raise CommandError(f"bunshin {args.command}: --runtime docker forks its own way (a fresh container from the "
                           f"committed files, the app's state restored): drop --backend {args.backend}")
    if args.command == "eval":
        from bunshin.policies.registry import make_policy

        from .commands.eval_command import run_eval

        prefix, speculation = prefix_settings(args), spec_settings(args)
        try:
            policy = make_policy(args.policy, args.time_scale)
        except (ValueError, OSError) as exc:
            raise CommandError(f"bunshin eval: --policy: {exc}") from exc
        if args.task_dir is not None:
            if not args.task_dir.is_dir():
                raise CommandError(f"bunshin eval: --task-dir {args.task_dir}: not a directory")
            if any(name in ("tasks_dir", "lenient") for name, _ in args.set):
                raise CommandError("bunshin eval: --task-dir sets the suite's tasks_dir and lenient knobs itself")
            args.set = [*args.set, ("tasks_dir", str(args.task_dir)), ("lenient", True)]
        with_time_scale(args, args.time_scale)
        from bunshin.policies.base import PolicyError

        try:
            with ray_cluster(args.ray) as address:
                work = run_eval(make_suite(args), policy, args.out, tasks_file=args.tasks, limit=args.limit,
                                group_size=args.group_size, concurrency=args.concurrency,
                                memory_budget=args.memory_budget, backend=args.backend, seed=args.seed,
                                max_steps=args.max_steps, prefix=prefix, speculation=speculation,
                                ray_address=address, warm_pool=args.warm_pool, image=args.image,
                                runtime_kind=args.runtime)
                summary = event_loop.run(closing(policy, work))
        except PolicyError as exc:  # the preflight, or a model server not set up for the policy: the run's failure
            raise CommandError(f"bunshin eval: {args.policy}: {type(exc).__name__}: {exc}") from exc
        print(f"wrote {args.out / 'trajectories.jsonl'} and {args.out / 'summary.json'}")
        return 0 if summary["rollouts"] else 1
    if args.command == "replay":
        from .commands.replay_command import recorded_knobs, run_replay
        from .records import read_jsonl
        from .report import write_json

        first = next(read_jsonl(args.trajectories), None)
        if first is None:
            raise CommandError(f"{args.trajectories}: no trajectories")
        args.suite = first.suite
        given = [k for k, _ in args.set] + (["catalog_size"] if args.catalog_size is not None else []) + (
            ["browser", "ksm"] if args.browser is not None else []) + (["ksm"] if args.ksm is not None else [])
        recorded = recorded_knobs(args.trajectories, given)
        if recorded:
            print(f"replaying with the knobs recorded beside it: "
                  f"{' '.join(f'{k}={v}' for k, v in sorted(recorded.items()))}", file=sys.stderr)
        args.set = list(recorded.items()) + list(args.set)
        report = event_loop.run(run_replay(make_suite(args), args.trajectories, backend=args.backend,
                                           concurrency=args.concurrency, image=args.image,
                                           runtime_kind=args.runtime))
        print(json.dumps({k: v for k, v in report.items() if k != "differences"}))
        if args.json:
            write_json(args.json, report)
        ok = report["identical_observations"] == report["identical_rewards"] == report["trajectories"]
        return 0 if ok else 1
    if args.command == "files":
        from bunshin.envs.xdesktop.files_cache import FilesCache

        try:
            data = args.file.read_bytes()
        except OSError as exc:
            raise CommandError(f"bunshin files add: {args.file}: {exc.strerror}") from exc
        blob = FilesCache(args.files_cache).put(args.url, data)
        print(f"{args.url} -> {blob} ({len(data)} bytes)")
        return 0
    if args.command == "webarena" and args.webarena_command == "tasks":
        from .commands.webarena_tasks import table, tasks_report
        from .report import write_json

        path, deployment, loaded = tasks_report(args.task_file, args.site, judge=bool(args.judge))
        for line in table(path, deployment, loaded):
            print(line)
        if args.refusals:
            for refusal in loaded.refused:
                print(f"REFUSED {refusal.file}: {refusal.reason}")
        if args.json:
            write_json(args.json, loaded.counts())
        return 0
    if args.command == "suite" and args.suite_command == "check":
        from .commands.suite_check import check as check_suite
        from .report import write_json

        if args.task_dir is not None:
            if not args.task_dir.is_dir():
                raise CommandError(f"bunshin suite check: --task-dir {args.task_dir}: not a directory")
            args.set = [*args.set, ("tasks_dir", str(args.task_dir)), ("lenient", True)]
        report = event_loop.run(check_suite(make_suite(args), limit=args.limit, concurrency=args.concurrency))
        print(json.dumps({k: (len(v) if k == "refused" else v) for k, v in report.items() if k != "failures"}))
        for refused in report["refused"]:
            print(f"REFUSED {refused['file']}: {refused['reason']}")
        for failure in report["failures"]:
            print(f"FAILED task {failure['task']} ({failure['template']}) {failure['attempt']}: {failure['reason']}")
        if args.json:
            write_json(args.json, report)
        ok = report["oracle_pass"] == report["tasks"] - report["no_reference"] and not report["failures"]
        return 0 if ok else 1
    return 2


if __name__ == "__main__":
    sys.exit(main())

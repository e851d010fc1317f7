"""The flags several commands share, and what they mean: sizes and budgets, the suite and its knobs (``--suite``,
``--set``, ``--catalog-size``, ``--browser``), the prefix cache's and speculation's flags as settings objects.

Owns: parsing those flags' values, adding the suite's and speculation's flags to a parser, and turning the parsed
arguments into a suite, ``PrefixSettings`` and ``SpecSettings``; a flag refused here is an ``ArgumentRefused`` (a
value the suite refuses, a ``CommandError``). Used by ``cli.py``'s parser and dispatch and by the benchmarks' commands.
Must never: exit (``cli.main`` alone turns a refusal into an exit status), or run anything.
"""

from __future__ import annotations

import argparse
import inspect
import os
from pathlib import Path
from typing import Any, TypedDict

from bunshin.envs.suites.base import Suite

from ..errors import ArgumentRefused, CommandError
from ..prefix.settings import PrefixSettings
from ..speculation.settings import SpecSettings

DEFAULT = "default"  # a budget flag not given: PrefixSettings' own default


def nbytes_of(value: str | int) -> int:
    """Parse sizes such as ``64M``, ``1G``, ``256MiB``, ``4096``."""
    if isinstance(value, int):
        return value
    text = value.strip().upper().removesuffix("B").removesuffix("I")
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def budget_of(value: str) -> int | str | None:
    """A budget in bytes (``256M``...), ``none`` for unbounded (``default``: the flag was left out)."""
    text = value.strip().lower()
    return None if text in ("none", "unbounded") else DEFAULT if text == DEFAULT else nbytes_of(value)


def hot_budget_of(value: str) -> int | float | str | None:
    """``--hot-budget``: ``budget_of``'s, or ``10%``: a share of the most the run has held without its snapshots
    (a float)."""
    text = value.strip()
    if not text.endswith("%"):
        return budget_of(value)
    try:
        share = float(text[:-1]) / 100
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"bad percentage {value!r}") from exc
    if not 0.0 <= share <= 10.0:
        raise argparse.ArgumentTypeError(f"--hot-budget {value}: a share must be within 0% and 1000%")
    return share


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


def knob(text: str) -> tuple[str, object]:
    """``--set NAME=VALUE``: an int, a float, ``true``/``false`` or else the text."""
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    for parse in (int, float):
        try:
            return name, parse(value)
        except ValueError:
            pass
    return name, {"true": True, "false": False}.get(value.lower(), value)


def suite_arguments(parser: argparse.ArgumentParser) -> None:
    from bunshin.envs.suites.registry import SUITES

    parser.add_argument("--suite", choices=sorted(SUITES), required=True)
    parser.add_argument("--catalog-size", type=int, help="web shop: products in the catalog (default 20000)")
    parser.add_argument("--set", type=knob, action="append", default=[], metavar="KNOB=VALUE",
                        help="another keyword argument of the suite (e.g. image_px=48, cache_mb=120)")
    parser.add_argument("--files-cache", type=Path, metavar="DIR", default=None,
                        help="osworld: the files OSWorld tasks download, by URL (default $BUNSHIN_FILES_CACHE or "
                             "/var/lib/bunshin/files; fill it with `bunshin files add URL FILE`); a task whose "
                             "file is missing is refused naming the URL")
    deployment_arguments(parser)
    browser_argument(parser)


BROWSERS = ("text", "chromium")


def deployment_arguments(parser: argparse.ArgumentParser) -> None:
    """``--task-file``, ``--site NAME=URL`` (repeated) and ``--judge URL``: a WebArena deployment, its task file and
    the judge model its fuzzy_match asks (the suite ``webarena``, ``bunshin webarena tasks``)."""
    parser.add_argument("--task-file", type=Path, metavar="FILE",
                        help="webarena: WebArena's task file (test.raw.json, a list of tasks; a config file; a "
                             "directory of them; default libwebarena's test.raw.json, ./scripts/setup.sh --browsergym)")
    parser.add_argument("--site", action="append", default=[], metavar="NAME=URL",
                        help="webarena: a site of the deployment (shopping, shopping_admin, reddit, gitlab, "
                             "wikipedia, map, homepage); repeat it; the others are read from WA_SHOPPING and friends")
    parser.add_argument("--judge", metavar="URL",
                        help="webarena: the judge model for fuzzy_match, an OpenAI-compatible server (e.g. "
                             "http://host:8000/v1); without one those tasks are refused")


def browser_argument(parser: argparse.ArgumentParser) -> None:
    """``--browser``: the suite's ``browser`` knob, and ``--ksm on|off``: its ``ksm`` knob. Left out (None), the
    suite keeps its own default (text, off); a suite without a browser refuses them in ``make_suite``."""
    parser.add_argument("--browser", choices=BROWSERS, default=None,
                        help="web shop: the browser in every workspace: text (the embedded text browser, fast; the "
                             "default) or chromium (Debian's Chromium, real input events; docs/chromium.md)")
    parser.add_argument("--ksm", choices=("on", "off"), default=None,
                        help="web shop with Chromium: the workspaces' browsers opt into KSM (the kernel merges their "
                             "identical pages; ksmd is tuned while they run and the host's settings given back "
                             "after; docs/chromium.md). Default off")


def warm_pool_argument(parser: argparse.ArgumentParser) -> None:
    """``--warm-pool N``: ready browsers the live fork's clones take over (``RolloutEngine``'s ``warm_pool``)."""
    parser.add_argument("--warm-pool", type=int, default=None, metavar="N",
                        help="web shop with Chromium: browsers started ahead for the live fork's clones to take "
                             "over (default: 2, or --concurrency if less; 0: every clone launches its own)")


def image_of(text: str) -> str:
    """``--image``'s value: ``docker:NAME[:TAG]`` (a local Docker image), or an image directory or tarball."""
    from bunshin.envs.images.docker_roots import DockerRef, is_docker_ref

    if is_docker_ref(text):
        try:
            DockerRef.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc
    elif not os.path.exists(text):
        raise argparse.ArgumentTypeError(f"{text}: no such image directory or tarball (a Docker image is docker:NAME)")
    return text


def image_argument(parser: argparse.ArgumentParser) -> None:
    """``--image``: what every workspace stands on instead of the suite's declared image (``RolloutEngine``'s)."""
    parser.add_argument("--image", type=image_of, default=None, metavar="docker:NAME[:TAG]|DIR|TAR",
                        help="every workspace on this image instead of the suite's: a local Docker image "
                             "(docker:NAME[:TAG]; its files are taken once per image id and forked live like "
                             "any other, docs/docker.md), or a root file system's directory or tarball")
    parser.add_argument("--runtime", choices=("native", "docker"), default="native",
                        help="docker: every workspace a Docker container (a fork is a fresh container from the "
                             "source's committed files with its app's state restored, not a live fork; "
                             "--backend is then ignored; docs/docker.md)")


def with_time_scale(args: argparse.Namespace, time_scale: float) -> None:
    """The suite's ``time_scale`` knob (its tools' modelled latency, ``envs/latency.py``) follows ``time_scale``
    unless the user set the knob (``--set time_scale=X``); a suite without modelled latency (a real deployment's
    is real) has no such knob."""
    from bunshin.envs.suites.registry import suite_class

    if "time_scale" not in inspect.signature(suite_class(args.suite)).parameters:
        return
    if not any(name == "time_scale" for name, _ in args.set):
        args.set = [*args.set, ("time_scale", time_scale)]


def make_suite(args: argparse.Namespace) -> Suite:
    """The suite ``--suite`` names with the knobs of ``--set`` (and ``--catalog-size``, ``--browser``, ``--ksm``),
    its workspace images built."""
    from bunshin.envs.suites.registry import get_suite

    knobs = dict(args.set)
    if args.catalog_size is not None:
        if args.suite != "webshop":
            raise CommandError("--catalog-size is a web shop knob")
        knobs["catalog_size"] = args.catalog_size
    browser = getattr(args, "browser", None)
    if browser is not None:
        if not has_browser(args.suite):
            raise CommandError(f"--browser {browser}: suite {args.suite} has no browser (a web shop flag)")
        if knobs.get("browser", browser) != browser:
            raise CommandError(f"--browser {browser} and --set browser={knobs['browser']} disagree")
        knobs["browser"] = browser
    files_cache = getattr(args, "files_cache", None)
    if files_cache is not None:
        if args.suite != "osworld":
            raise CommandError(f"--files-cache: suite {args.suite} downloads nothing (an osworld flag)")
        knobs["files_cache"] = str(files_cache)
    task_file, sites, judge = getattr(args, "task_file", None), getattr(args, "site", []), getattr(args, "judge", None)
    if (task_file is not None or sites or judge) and args.suite != "webarena":
        raise CommandError(f"--task-file, --site and --judge: suite {args.suite} runs no WebArena deployment "
                           f"(webarena flags)")
    if judge:
        knobs["judge"] = judge
    if task_file is not None:
        knobs["task_file"] = str(task_file)
    if sites:
        knobs["sites"] = list(sites)
    ksm = getattr(args, "ksm", None)
    if ksm is not None and args.suite == "osworld":
        knobs["ksm"] = ksm == "on"
    elif ksm is not None:
        if not has_browser(args.suite):
            raise CommandError(f"--ksm {ksm}: suite {args.suite} has no browser (a web shop flag)")
        if ksm == "on" and knobs.get("browser", "text") == "text":
            raise CommandError("--ksm on: only Chromium workspaces opt into KSM: add --browser chromium")
        knobs["ksm"] = ksm == "on"
    try:
        suite = get_suite(args.suite, **knobs)
    except (TypeError, ValueError) as exc:
        raise CommandError(f"bad knob for suite {args.suite}: {exc}") from exc
    from .images import ensure_suite_images

    ensure_suite_images(suite)  # its workspace images, built now if this machine has not built them
    return suite


def has_browser(suite: str) -> bool:
    """Whether suite ``suite`` has a ``browser`` knob (its constructor takes one; the class is read, not built)."""
    from bunshin.envs.suites.registry import suite_class

    return "browser" in inspect.signature(suite_class(suite)).parameters


class Budgets(TypedDict, total=False):
    """``PrefixSettings``' budgets as keyword arguments."""

    hot_budget: int | None
    hot_share: float | None
    disk_budget: int | None


def budgets(args: argparse.Namespace) -> Budgets:
    """The prefix-cache budgets given on the command line (a flag left out keeps ``PrefixSettings``' default)."""
    given = Budgets()
    if isinstance(args.hot_budget, float):  # a share: no absolute bound besides it
        given["hot_budget"], given["hot_share"] = None, args.hot_budget
    elif args.hot_budget != DEFAULT:
        given["hot_budget"] = args.hot_budget
    if args.disk_budget != DEFAULT:
        given["disk_budget"] = args.disk_budget
    return given


def prefix_settings(args: argparse.Namespace) -> PrefixSettings | None:
    """``bunshin eval``'s prefix-cache flags as ``PrefixSettings`` (None without ``--prefix-cache``)."""
    given = [flag for flag, value in (("--cache-dir", args.cache_dir), ("--hot-budget", args.hot_budget),
                                      ("--disk-budget", args.disk_budget)) if value not in (None, DEFAULT)]
    if not args.prefix_cache:
        if given:
            raise CommandError(f"bunshin eval: {', '.join(given)} need --prefix-cache")
        return None
    try:
        return PrefixSettings(cache_dir=args.cache_dir, strategy=args.cache_strategy, **budgets(args))
    except ValueError as exc:
        raise CommandError(f"bunshin eval: {exc}") from exc


SPEC_FLAGS = (("--spec-slots", "spec_slots", None), ("--spec-threshold", "spec_threshold", None),
              ("--spec-memory", "spec_memory", DEFAULT), ("--spec-train", "spec_train", None),
              ("--spec-readonly", "spec_readonly", False), ("--spec-cpu-limit", "spec_cpu_limit", None))


def spec_settings(args: argparse.Namespace, command: str = "bunshin eval") -> SpecSettings | None:
    """The speculation flags as ``SpecSettings`` (a flag left out keeps its default). ``bunshin eval``: None
    without ``--speculate``, and a ``--spec-*`` flag without it is refused; with ``--prefix-cache --cache-dir
    DIR`` the selector is saved in DIR. ``bunshin bench epoch``: the speculating modes' settings (their
    ``read_only`` and ``model_dir`` are the mode's), and a ``--spec-*`` flag with no such mode is refused. A
    refusal is an ``ArgumentRefused`` of ``command``."""
    given = [flag for flag, name, unset in SPEC_FLAGS if getattr(args, name, unset) != unset]
    if hasattr(args, "speculate"):
        if not args.speculate:
            if given:
                raise ArgumentRefused(command, f"{', '.join(given)} need{'s' if len(given) == 1 else ''} --speculate")
            return None
    elif given and not any(m in ("spec", "spec-readonly", "full") for m in args.modes):
        raise ArgumentRefused(command, f"{', '.join(given)} need a speculating mode (spec, spec-readonly or full)")
    if getattr(args, "spec_train", None) is not None and not args.spec_train.is_file():
        raise ArgumentRefused(command, f"--spec-train {args.spec_train}: no such file")
    kwargs: dict[str, Any] = {}
    for key, name in (("slots", "spec_slots"), ("threshold", "spec_threshold"), ("train_file", "spec_train"),
                      ("cpu_limit", "spec_cpu_limit")):
        if getattr(args, name, None) is not None:
            kwargs[key] = getattr(args, name)
    memory: tuple[str, float] | str | None = getattr(args, "spec_memory", DEFAULT)  # see spec_memory_of
    if memory != DEFAULT:
        kind, amount = memory if isinstance(memory, tuple) else (None, 0.0)  # None: unbounded
        kwargs["memory_headroom"] = amount if kind == "headroom" else None
        kwargs["memory_budget"] = int(amount) if kind == "bytes" else None
    if getattr(args, "spec_readonly", False):
        kwargs["read_only"] = True
    if getattr(args, "prefix_cache", False) and getattr(args, "cache_dir", None) is not None:
        kwargs["model_dir"] = args.cache_dir
    try:
        return SpecSettings(**kwargs)
    except ValueError as exc:
        raise ArgumentRefused(command, str(exc)) from exc


def spec_arguments(parser: argparse.ArgumentParser, bench: bool = False) -> None:
    need = "speculating modes" if bench else "with --speculate"
    parser.add_argument("--spec-slots", type=int, metavar="N",
                        help=f"{need}: speculative branches running at once, tail samples first (default 4)")
    parser.add_argument("--spec-threshold", type=float, metavar="P",
                        help=f"{need}: the probability the selector's first prediction must reach (default 0.5)")
    parser.add_argument("--spec-memory", type=spec_memory_of, default=DEFAULT, metavar="P%|BYTES",
                        help=f"{need}: memory for the branches: P%% lets them lift the run's memory at most P%% above "
                             "the most it has held without them (default 10%%), BYTES caps what they hold together "
                             "(256M), none: unbounded")
    parser.add_argument("--spec-cpu-limit", type=float, metavar="FRACTION",
                        help=f"{need}: no branch starts while the machine's cores were at least this busy over the "
                             "last half second (0.9: 90%%; default: no such rule)")
    parser.add_argument("--spec-train", type=Path, metavar="FILE",
                        help=f"{need}: recorded trajectories (JSON Lines, as eval's trajectories.jsonl) the "
                             "selector learns from before the first rollout")

"""The ``bunshin`` command line: ``doctor``, ``demo``, ``bench fork``.

Owns: parsing arguments and dispatching; every command's work lives in its own module.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bunshin.envs.backends import BACKENDS

from . import loop


def nbytes_of(value: str | int) -> int:
    """Parse sizes such as ``64M``, ``1G``, ``256MiB``, ``4096``."""
    if isinstance(value, int):
        return value
    text = value.strip().upper().removesuffix("B").removesuffix("I")
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bunshin", description="BunshinRL: rollouts on live forks of workspaces")
    sub = parser.add_subparsers(dest="command", required=True)

    doctor = sub.add_parser("doctor", help="what this host supports and which fork backends can run here")
    doctor.add_argument("--json", action="store_true", help="print JSON instead of a table")

    demo = sub.add_parser("demo", help="fork a live workspace a few times and show what it measured")
    demo.add_argument("--size", type=nbytes_of, default=nbytes_of("256M"))
    demo.add_argument("--clones", type=int, default=4)
    demo.add_argument("--backend", choices=BACKENDS, default="cow")

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    fork = bench_sub.add_parser("fork", help="freeze window, fork-to-ready and clone memory by size and backend")
    fork.add_argument("--sizes", type=_sizes, default=_sizes("64M,256M,1G"))
    fork.add_argument("--backends", type=_backends, default=["cow", "restore"])
    fork.add_argument("--forks", type=int, default=10, help="forks per backend and size")
    fork.add_argument("--json", type=Path, help="write results as JSON here")
    fork.add_argument("--plot", type=Path, help="write a PNG plot here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "doctor":
        from bunshin.envs.doctor import diagnose

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
        from .demo import demo

        return loop.run(demo(args.size, args.clones, args.backend))
    if args.command == "bench" and args.bench == "fork":
        from .bench import fork as bench_fork

        return loop.run(bench_fork.run(args.sizes, args.backends, args.forks, args.json, args.plot)) and 0
    return 2


if __name__ == "__main__":
    sys.exit(main())

"""``bunshin bench fork --peer sandlock``: Sandlock's copy-on-write process fork of the same heap, the peer our
whole-workspace fork is measured against.

Owns: one round of the peer (a fresh Sandlock sandbox whose ``init_fn`` makes the heap as the fork benchmark's
``HeapApp`` does: the same size, the same page size, every page written; then ``fork(1)``, whose clone notes when
it runs and what it holds), and running the rounds in a process of their own (``python -m``): Sandlock forks the
process that calls it, so it must be a process like a workspace's host (an interpreter with numpy and the heap),
not the benchmark's engine.
What the peer's figures include: its fork of the process (the page tables' copy) and the clone's start, from the
moment ``init_fn`` returned to the moment ``work_fn`` runs; they leave out what a workspace fork also makes
(namespaces, a cgroup, a file-system snapshot, a socket to the engine) and any freeze (Sandlock does not stop its
source; the process it forks is its own child that only waits).
Must never: run in the engine's process.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PEERS = ("sandlock",)
SANDLOCK = "sandlock==0.9.0"  # the version measured (the test extra installs it)


def _own_memory() -> tuple[int, int, int]:
    """The calling process's private memory, page tables and memory in huge pages, in bytes."""
    private = tables = huge = 0
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith(("Private_Clean:", "Private_Dirty:")):
            private += int(line.split()[1]) << 10
        elif line.startswith("AnonHugePages:"):
            huge = int(line.split()[1]) << 10
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmPTE:"):
            tables = int(line.split()[1]) << 10
    return private, tables, huge


def sandlock_round(size: int, huge_pages: bool) -> dict[str, float]:
    """One fork of a process holding ``size`` bytes of written heap: fork-to-ready (ms), the clone's private
    memory and page tables right after it started."""
    from sandlock import Sandbox

    from bunshin.envs.app import HugeHeap
    from bunshin.envs.runtime.heap_app import fill_distinct

    with tempfile.TemporaryDirectory(prefix="bunshin-peer-") as where:
        marks = Path(where) / "marks"
        held: list[HugeHeap] = []

        def init() -> None:  # in Sandlock's child: the source
            heap = HugeHeap(size, huge_pages)
            fill_distinct(heap)
            held.append(heap)
            huge = _own_memory()[2]
            marks.write_text(f"{huge} {time.monotonic_ns()}\n")  # the source is ready: Sandlock forks from here

        def work(clone_id: int) -> None:  # in the clone
            at = time.monotonic_ns()
            private, tables, _ = _own_memory()
            with open(marks, "a") as f:
                f.write(f"{at} {private} {tables}\n")

        Sandbox(fs_readable=["/proc", where], fs_writable=[where], init_fn=init, work_fn=work).fork(1)
        lines = marks.read_text().split() if marks.exists() else []
        if len(lines) != 5:
            raise RuntimeError(f"sandlock: the fork did not run its clone (marks: {lines})")
        huge, ready, clone_at, private, tables = (int(x) for x in lines)
        return {"ready_ms": (clone_at - ready) / 1e6, "clone_private_bytes": private, "clone_page_tables_bytes": tables,
                "source_huge_bytes": huge}


def measure(peer: str, size: int, forks: int, huge_pages: bool) -> dict[str, list[float]]:
    if peer not in PEERS:
        raise ValueError(f"unknown peer {peer!r} (known: {', '.join(PEERS)})")
    samples: dict[str, list[float]] = {"ready_ms": [], "clone_private_bytes": [], "clone_page_tables_bytes": [],
                                       "source_huge_bytes": []}
    for i in range(forks):
        one = sandlock_round(size, huge_pages)
        for key, value in one.items():
            samples[key].append(value)
        print(f"[{peer} {size >> 20} MiB {'huge' if huge_pages else '4k'}] round {i + 1}/{forks}: "
              f"ready {one['ready_ms']:.1f} ms, clone private {int(one['clone_private_bytes']) >> 10} KiB",
              file=sys.stderr, flush=True)
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("peer", choices=PEERS)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--forks", type=int, required=True)
    parser.add_argument("--pages", choices=["huge", "4k"], required=True)
    args = parser.parse_args(argv)
    try:
        import sandlock  # noqa: F401
    except ImportError:
        print(f"bench fork --peer sandlock needs Sandlock: pip install '{SANDLOCK}' (in the test extra)",
              file=sys.stderr)
        return 2
    result: dict[str, Any] = measure(args.peer, args.size, args.forks, args.pages == "huge")
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())

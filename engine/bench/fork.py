"""``bunshin bench fork``: the live fork against the private-restore baseline, by workspace size and page size,
and against a peer's process fork (``--peer sandlock``, ``fork_peer.py``).

Owns: filling a workspace application with live heap state (in huge pages, or in 4 KiB pages with ``--pages 4k``:
an application that does not advise its memory), forking it repeatedly with each backend, and
measuring per round: a tool call on the source (a new state), a first fork (the source's freeze window: for the
restore backend its dump; fork-to-ready, that dump included) and a second fork of the same state (fork-to-ready:
a restore from the existing dump, as CRIU restores one image many times); the first clone's private memory and
page tables right after the fork and after it writes 1% and 10% of its heap pages; a live clone's setup by step (its
cgroup, namespaces, root, workers, loopback, re-opened files, the app's ``after_fork``: ``Ready.steps_s``); and, for
the live backends, the CPU of a branch thrown away unused (a third fork, closed at once): the source's for the fork
(its middle process's included), the clone's whole life and exit (``wait4``, from the nursery), the nursery's and
the engine process's over the fork and the close. Left out: ksmd, kernel threads, the btrfs cleaner.
``--two-step`` adds the cow backend with the double fork it had before one-step clones (rows ``cow-2step``,
``fork/sibling.py``), ratios cow/cow-2step.
Must never: compare numbers from different runs: both backends and the peer run here, one after the other (the
peer in a process of its own, as a workspace's host is one).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from bunshin.envs import AppSpec, ToolCall, WorkspaceRuntime
from bunshin.envs.records import Limits
from bunshin.envs.runtime.memory import page_tables

from ..errors import EngineError
from ..report import human_bytes, markdown_table, percentile, pyplot, write_json

COLUMNS = [
    ("backend", "backend"), ("size", "size"), ("pages", "pages"), ("source_huge", "source in huge pages"),
    ("forks", "forks"), ("shell_forks", "in a prepared shell"),
    ("freeze_ms_p50", "freeze p50 ms"), ("freeze_ms_p95", "freeze p95 ms"),
    ("ready_ms_p50", "ready p50 ms"), ("ready_ms_p95", "ready p95 ms"),
    ("again_ms_p50", "same state again: ready p50 ms"),
    ("clone_private", "clone private"), ("clone_page_tables", "clone page tables"), ("clone_private_1pct", "after 1% writes"),
    ("clone_private_10pct", "after 10% writes"), ("branch_cpu_ms_p50", "thrown-away branch CPU p50 ms"),
]


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


PAGES = ("huge", "4k")


TWO_STEP = "cow-2step"  # the cow backend with one_step_clones=False
NO_SHELLS = "cow-noshell"  # the cow backend with prepared_shells=0: every fork makes its cgroup and namespaces
VARIANTS: dict[str, dict[str, Any]] = {TWO_STEP: {"one_step_clones": False}, NO_SHELLS: {"prepared_shells": 0}}


async def _measure(backend: str, size: int, forks: int, pages: str) -> dict[str, Any]:
    app = AppSpec(target="bunshin.envs.runtime.heap_app:HeapApp",
                  kwargs={"size_bytes": size, "huge_pages": pages == "huge"})
    limits = Limits(memory_bytes=max(4 * size, 1 << 30) + (1 << 30), pids=512)
    freeze, ready, again, private, tables, private1, private10 = [], [], [], [], [], [], []
    steps: dict[str, list[float]] = {}  # the live clone's setup by step (cow), ms
    one_steps: list[bool] = []
    shells: list[bool] = []
    branch_cpu: list[dict[str, float]] = []  # ms by part
    async with WorkspaceRuntime(backend="cow" if backend in VARIANTS else backend, limits=limits,
                                **VARIANTS.get(backend, {})) as rt:
        started = time.monotonic()
        source = await rt.create(app)
        held = source.memory()
        _log(f"[{backend} {human_bytes(size)} {pages}] source ready in {time.monotonic() - started:.2f}s, "
             f"memory {human_bytes(held.pss)} PSS, {human_bytes(held.anon_huge)} in huge pages")
        for i in range(forks):
            await source.execute(ToolCall(name="write_pages", args={"page": i, "value": i & 0xFF}))
            clone = await source.fork()
            second = await source.fork()
            if clone.last_fork is None or second.last_fork is None:
                raise EngineError(f"the {rt.backend_name} backend returned {clone.id} without its fork timing")
            freeze.append(clone.last_fork.freeze_s * 1e3)
            ready.append(clone.last_fork.ready_s * 1e3)
            again.append(second.last_fork.ready_s * 1e3)
            one_steps.append(clone.last_fork.one_step)
            shells.append(clone.last_fork.shell)
            for step, took in clone.last_fork.clone_steps_s.items():
                steps.setdefault(step, []).append(took * 1e3)
            await second.close()
            if backend != "restore":
                branch_cpu.append(await _thrown_away_branch_cpu(rt, source))
            private.append(clone.memory().private)
            tables.append(sum(page_tables(pid) for pid in clone.cgroup.procs()))
            await clone.execute(ToolCall(name="write_pages", args={"fraction": 0.01}))
            private1.append(clone.memory().private)
            await clone.execute(ToolCall(name="write_pages", args={"fraction": 0.10, "value": 0xCD}))
            private10.append(clone.memory().private)
            await clone.close()
            _log(f"[{backend} {human_bytes(size)} {pages}] round {i + 1}/{forks}: freeze {freeze[-1]:.1f} ms, "
                 f"ready {ready[-1]:.1f} ms, again {again[-1]:.1f} ms, clone private {human_bytes(private[-1])}")
        shell_stats = dataclasses.asdict(rt.shell_stats())
    med = lambda xs: int(percentile(xs, 50))  # noqa: E731
    return {
        "backend": backend, "size_bytes": size, "size": human_bytes(size), "pages": pages, "forks": forks,
        "one_step_forks": sum(one_steps), "shell_forks": sum(shells), "shells": shell_stats,
        "source_huge_bytes": held.anon_huge, "source_huge": human_bytes(held.anon_huge),
        "freeze_ms_p50": percentile(freeze, 50), "freeze_ms_p95": percentile(freeze, 95),
        "ready_ms_p50": percentile(ready, 50), "ready_ms_p95": percentile(ready, 95),
        "again_ms_p50": percentile(again, 50), "again_ms_p95": percentile(again, 95),
        "clone_page_tables_bytes": med(tables), "clone_page_tables": human_bytes(med(tables)),
        "clone_private_bytes": med(private), "clone_private_bytes_after_1pct": med(private1),
        "clone_private_bytes_after_10pct": med(private10),
        "clone_private": human_bytes(med(private)), "clone_private_1pct": human_bytes(med(private1)),
        "clone_private_10pct": human_bytes(med(private10)),
        "clone_steps_ms_p50": {step: percentile(took, 50) for step, took in steps.items()},
        **_branch_cpu_summary(branch_cpu),
        "samples": {"freeze_ms": freeze, "ready_ms": ready, "again_ms": again, "clone_private_bytes": private,
                    "clone_page_tables_bytes": tables, "clone_steps_ms": steps, "branch_cpu_ms": branch_cpu},
    }


def _schedstat_ns(pid: int) -> int:
    """The CPU time of process ``pid``'s main thread, ns (its schedstat)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


async def _thrown_away_branch_cpu(rt: WorkspaceRuntime, source: Any) -> dict[str, float]:
    """Fork ``source`` and close the clone at once; the CPU each party spent on it, ms."""
    nursery = rt.nursery
    engine0, nursery0 = time.process_time_ns(), _schedstat_ns(nursery.pid)
    branch = await source.fork()
    await branch.close()
    clone_ns = nursery.exit_cpu_ns(branch.pid)
    for _ in range(100):  # the close waited for its exit; the report may trail it by a message
        if clone_ns is not None:
            break
        await asyncio.sleep(0.01)
        clone_ns = nursery.exit_cpu_ns(branch.pid)
    if branch.last_fork is None or clone_ns is None:
        raise EngineError(f"the thrown-away branch {branch.id}: no fork timing or exit CPU reported")
    parts = {"source": branch.last_fork.source_cpu_s * 1e3, "clone": clone_ns / 1e6,
             "nursery": (_schedstat_ns(nursery.pid) - nursery0) / 1e6,
             "engine": (time.process_time_ns() - engine0) / 1e6}
    return {**parts, "total": sum(parts.values())}


def _branch_cpu_summary(rounds: list[dict[str, float]]) -> dict[str, Any]:
    if not rounds:
        return {}
    return {"branch_cpu_ms_p50": percentile([r["total"] for r in rounds], 50),
            "branch_cpu_ms_p50_by_part": {part: percentile([r[part] for r in rounds], 50) for part in rounds[0]}}


async def _measure_peer(peer: str, size: int, forks: int, pages: str) -> dict[str, Any]:
    """The peer's rounds, in a process of their own (``fork_peer.py``); its progress goes to our stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bunshin.engine.bench.fork_peer", peer, "--size", str(size), "--forks", str(forks),
        "--pages", pages, stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise EngineError(f"bench fork --peer {peer}: its run failed (exit {proc.returncode}; its error is above)")
    samples = json.loads(out)
    med = lambda xs: int(percentile(xs, 50))  # noqa: E731
    return {
        "backend": peer, "size_bytes": size, "size": human_bytes(size), "pages": pages, "forks": forks,
        "source_huge_bytes": med(samples["source_huge_bytes"]), "source_huge": human_bytes(med(samples["source_huge_bytes"])),
        "ready_ms_p50": percentile(samples["ready_ms"], 50), "ready_ms_p95": percentile(samples["ready_ms"], 95),
        "clone_private_bytes": med(samples["clone_private_bytes"]),
        "clone_private": human_bytes(med(samples["clone_private_bytes"])),
        "clone_page_tables_bytes": med(samples["clone_page_tables_bytes"]),
        "clone_page_tables": human_bytes(med(samples["clone_page_tables_bytes"])),
        "samples": samples,
    }


def _ratios(results: list[dict[str, Any]], other: str) -> list[dict[str, Any]]:
    """cow against ``other`` (the restore baseline, or a peer) at each size and page size, on what both measure."""
    by = {(r["backend"], r["size_bytes"], r["pages"]): r for r in results}
    out = []
    for (backend, size, pages), r in sorted(by.items()):
        base = by.get((other, size, pages))
        if backend != "cow" or base is None:
            continue
        row = {"size_bytes": size, "size": human_bytes(size), "pages": pages}
        for key in ("freeze_ms_p50", "ready_ms_p50", "again_ms_p50"):
            if key in base:
                row[key.removesuffix("_ms_p50") + "_p50_ratio"] = r[key] / base[key]
        row["clone_private_ratio"] = r["clone_private_bytes"] / max(base["clone_private_bytes"], 1)
        out.append(row)
    return out


def _plot(results: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for backend, pages in sorted({(r["backend"], r["pages"]) for r in results}):
        rows = sorted((r for r in results if (r["backend"], r["pages"]) == (backend, pages)),
                      key=lambda r: r["size_bytes"])
        xs = [r["size_bytes"] / 2**20 for r in rows]
        label = f"{backend} ({pages} pages)"
        if "freeze_ms_p50" in rows[0]:  # a peer does not stop its source
            axes[0].plot(xs, [r["freeze_ms_p50"] for r in rows], "o-", label=label)
        axes[1].plot(xs, [r["ready_ms_p50"] for r in rows], "o-", label=label)
        axes[2].plot(xs, [r["clone_private_bytes"] / 2**20 for r in rows], "o-", label=label)
    for ax, title in zip(axes, ("source freeze window p50 (ms)", "fork-to-ready p50 (ms)",
                                "clone private memory after fork (MiB)"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("workspace heap (MiB)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _print_clone_steps(results: list[dict[str, Any]]) -> None:
    """Where a live clone's setup went, step by step (p50 ms), for the rows that have it."""
    rows = [r for r in results if r.get("clone_steps_ms_p50")]
    if not rows:
        return
    names = list(dict.fromkeys(step for r in rows for step in r["clone_steps_ms_p50"]))
    print()
    print(markdown_table([{"backend": r["backend"], "size": r["size"], "pages": r["pages"],
                           **{n: r["clone_steps_ms_p50"].get(n, "") for n in names}} for r in rows],
                         [("backend", "clone setup, p50 ms: backend"), ("size", "size"), ("pages", "pages"),
                          *[(n, n) for n in names]]))


def _print_branch_cpu(results: list[dict[str, Any]]) -> None:
    """A thrown-away branch's CPU by party (p50 ms), for the rows that have it."""
    rows = [r for r in results if r.get("branch_cpu_ms_p50_by_part")]
    if not rows:
        return
    parts = list(rows[0]["branch_cpu_ms_p50_by_part"])
    print()
    print(markdown_table([{"backend": r["backend"], "size": r["size"], "pages": r["pages"],
                           **{p: f"{r['branch_cpu_ms_p50_by_part'][p]:.2f}" for p in parts}} for r in rows],
                         [("backend", "thrown-away branch CPU, p50 ms: backend"), ("size", "size"), ("pages", "pages"),
                          *[(p, p) for p in parts]]))


def _print_ratios(rows: list[dict[str, Any]], other: str) -> None:
    if not rows:
        return
    print()
    shown = [{k: (f"{v:.4f}" if k.endswith("_ratio") else v) for k, v in r.items()} for r in rows]
    columns = [("size", "size"), ("pages", "pages"), ("freeze_p50_ratio", f"freeze cow/{other}"),
               ("ready_p50_ratio", f"ready cow/{other}"), ("again_p50_ratio", f"same state again: ready cow/{other}"),
               ("clone_private_ratio", f"clone private cow/{other}")]
    print(markdown_table(shown, [c for c in columns if any(c[0] in r for r in rows) or c[0] in ("size", "pages")]))


async def run(sizes: list[int], backends: list[str], forks: int, json_path: Path | None, plot_path: Path | None,
              pages: tuple[str, ...] = ("huge",), peer: str | None = None, two_step: bool = False,
              no_shells: bool = False) -> dict[str, Any]:
    results = []
    variants = [name for name, wanted in ((TWO_STEP, two_step), (NO_SHELLS, no_shells)) if wanted]
    for backend in [*backends, *variants]:
        for page in pages:
            for size in sizes:
                results.append(await _measure(backend, size, forks, page))
    if peer is not None:
        for page in pages:
            for size in sizes:
                results.append(await _measure_peer(peer, size, forks, page))
    data: dict[str, Any] = {"results": results, "ratios_cow_vs_restore": _ratios(results, "restore")}
    if peer is not None:
        data[f"ratios_cow_vs_{peer}"] = _ratios(results, peer)
    if two_step:
        data["ratios_cow_vs_two_step"] = _ratios(results, TWO_STEP)
    if no_shells:
        data["ratios_cow_vs_no_shells"] = _ratios(results, NO_SHELLS)
    print(markdown_table(results, COLUMNS))
    _print_clone_steps(results)
    _print_branch_cpu(results)
    _print_ratios(data["ratios_cow_vs_restore"], "restore")
    if peer is not None:
        _print_ratios(data[f"ratios_cow_vs_{peer}"], peer)
    if two_step:
        _print_ratios(data["ratios_cow_vs_two_step"], TWO_STEP)
    if no_shells:
        _print_ratios(data["ratios_cow_vs_no_shells"], NO_SHELLS)
    if json_path:
        write_json(json_path, data)
    if plot_path:
        _plot(results, plot_path)
    return data


def main(sizes: list[int], backends: list[str], forks: int, json_path: Path | None, plot_path: Path | None) -> int:
    asyncio.run(run(sizes, backends, forks, json_path, plot_path))
    return 0

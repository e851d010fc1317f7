"""``bunshin bench fork``: the live fork against the private-restore baseline, by workspace size.

Owns: filling a workspace application with live heap state, forking it repeatedly with each backend, and
measuring per round: a tool call on the source (a new state), a first fork (the source's freeze window: for the
restore backend its dump; fork-to-ready, that dump included) and a second fork of the same state (fork-to-ready:
a restore from the existing dump, as CRIU restores one image many times); the first clone's private memory and
page tables right after the fork and after it writes 1% and 10% of its heap pages.
Must never: compare numbers from different runs: both backends run here, in this process, one after the other.
"""

from __future__ import annotations

import asyncio
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
    ("backend", "backend"), ("size", "size"), ("forks", "forks"),
    ("freeze_ms_p50", "freeze p50 ms"), ("freeze_ms_p95", "freeze p95 ms"),
    ("ready_ms_p50", "ready p50 ms"), ("ready_ms_p95", "ready p95 ms"),
    ("again_ms_p50", "same state again: ready p50 ms"),
    ("clone_private", "clone private"), ("clone_page_tables", "clone page tables"), ("clone_private_1pct", "after 1% writes"),
    ("clone_private_10pct", "after 10% writes"),
]


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def _measure(backend: str, size: int, forks: int) -> dict[str, Any]:
    app = AppSpec(target="bunshin.envs.runtime.heap_app:HeapApp", kwargs={"size_bytes": size})
    limits = Limits(memory_bytes=max(4 * size, 1 << 30) + (1 << 30), pids=512)
    freeze, ready, again, private, tables, private1, private10 = [], [], [], [], [], [], []
    async with WorkspaceRuntime(backend=backend, limits=limits) as rt:
        started = time.monotonic()
        source = await rt.create(app)
        _log(f"[{backend} {human_bytes(size)}] source ready in {time.monotonic() - started:.2f}s, "
             f"memory {human_bytes(source.memory().pss)} PSS")
        for i in range(forks):
            await source.execute(ToolCall(name="write_pages", args={"page": i, "value": i & 0xFF}))
            clone = await source.fork()
            second = await source.fork()
            if clone.last_fork is None or second.last_fork is None:
                raise EngineError(f"the {rt.backend_name} backend returned {clone.id} without its fork timing")
            freeze.append(clone.last_fork.freeze_s * 1e3)
            ready.append(clone.last_fork.ready_s * 1e3)
            again.append(second.last_fork.ready_s * 1e3)
            await second.close()
            private.append(clone.memory().private)
            tables.append(sum(page_tables(pid) for pid in clone.cgroup.procs()))
            await clone.execute(ToolCall(name="write_pages", args={"fraction": 0.01}))
            private1.append(clone.memory().private)
            await clone.execute(ToolCall(name="write_pages", args={"fraction": 0.10, "value": 0xCD}))
            private10.append(clone.memory().private)
            await clone.close()
            _log(f"[{backend} {human_bytes(size)}] round {i + 1}/{forks}: freeze {freeze[-1]:.1f} ms, "
                 f"ready {ready[-1]:.1f} ms, again {again[-1]:.1f} ms, clone private {human_bytes(private[-1])}")
    med = lambda xs: int(percentile(xs, 50))  # noqa: E731
    return {
        "backend": backend, "size_bytes": size, "size": human_bytes(size), "forks": forks,
        "freeze_ms_p50": percentile(freeze, 50), "freeze_ms_p95": percentile(freeze, 95),
        "ready_ms_p50": percentile(ready, 50), "ready_ms_p95": percentile(ready, 95),
        "again_ms_p50": percentile(again, 50), "again_ms_p95": percentile(again, 95),
        "clone_page_tables_bytes": med(tables), "clone_page_tables": human_bytes(med(tables)),
        "clone_private_bytes": med(private), "clone_private_bytes_after_1pct": med(private1),
        "clone_private_bytes_after_10pct": med(private10),
        "clone_private": human_bytes(med(private)), "clone_private_1pct": human_bytes(med(private1)),
        "clone_private_10pct": human_bytes(med(private10)),
        "samples": {"freeze_ms": freeze, "ready_ms": ready, "again_ms": again, "clone_private_bytes": private,
                    "clone_page_tables_bytes": tables},
    }


def _ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by = {(r["backend"], r["size_bytes"]): r for r in results}
    out = []
    for (backend, size), r in sorted(by.items()):
        base = by.get(("restore", size))
        if backend != "cow" or base is None:
            continue
        out.append({
            "size_bytes": size, "size": human_bytes(size),
            "freeze_p50_ratio": r["freeze_ms_p50"] / base["freeze_ms_p50"],
            "ready_p50_ratio": r["ready_ms_p50"] / base["ready_ms_p50"],
            "again_p50_ratio": r["again_ms_p50"] / base["again_ms_p50"],
            "clone_private_ratio": r["clone_private_bytes"] / max(base["clone_private_bytes"], 1),
        })
    return out


def _plot(results: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for backend in sorted({r["backend"] for r in results}):
        rows = sorted((r for r in results if r["backend"] == backend), key=lambda r: r["size_bytes"])
        xs = [r["size_bytes"] / 2**20 for r in rows]
        axes[0].plot(xs, [r["freeze_ms_p50"] for r in rows], "o-", label=backend)
        axes[1].plot(xs, [r["ready_ms_p50"] for r in rows], "o-", label=backend)
        axes[2].plot(xs, [r["clone_private_bytes"] / 2**20 for r in rows], "o-", label=backend)
    for ax, title in zip(axes, ("source freeze window p50 (ms)", "fork-to-ready p50 (ms)",
                                "clone private memory after fork (MiB)"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("workspace heap (MiB)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def run(sizes: list[int], backends: list[str], forks: int, json_path: Path | None,
              plot_path: Path | None) -> dict[str, Any]:
    results = []
    for backend in backends:
        for size in sizes:
            results.append(await _measure(backend, size, forks))
    data = {"results": results, "ratios_cow_vs_restore": _ratios(results)}
    print(markdown_table(results, COLUMNS))
    if data["ratios_cow_vs_restore"]:
        print()
        shown = [{k: (f"{v:.4f}" if k.endswith("_ratio") else v) for k, v in r.items()}
                 for r in data["ratios_cow_vs_restore"]]
        print(markdown_table(shown, [
            ("size", "size"), ("freeze_p50_ratio", "freeze cow/restore"), ("ready_p50_ratio", "ready cow/restore"),
            ("again_p50_ratio", "same state again: ready cow/restore"),
            ("clone_private_ratio", "clone private cow/restore")]))
    if json_path:
        write_json(json_path, data)
    if plot_path:
        _plot(results, plot_path)
    return data


def main(sizes: list[int], backends: list[str], forks: int, json_path: Path | None, plot_path: Path | None) -> int:
    asyncio.run(run(sizes, backends, forks, json_path, plot_path))
    return 0

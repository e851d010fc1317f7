"""``bunshin bench graft``: the kernel module's graft against ``fork()`` of the same source, in the VM.

Owns: running ``kmod/vmtest --bench-only`` once per run (each run boots Debian's 6.1 kernel under QEMU TCG and
measures 64 MiB and 512 MiB sources, 7 grafts and 7 forks each, see ``kmod/selftests/graft_bench.c``), and
presenting the runs: a table of medians with their range over runs, JSON, a PNG.
Must never: report an absolute time as a property of real hardware. Under TCG only ratios mean anything: both sides
run in the same emulated machine, in the same boot.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ..errors import CommandError
from ..report import markdown_table, pyplot

VMTEST = Path(__file__).resolve().parents[2] / "kmod" / "vmtest"


def run_once(timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="bunshin-bench-graft.") as tmp:
        out = Path(tmp) / "bench.json"
        done = subprocess.run([sys.executable, str(VMTEST), "--bench-only", "--bench", str(out)],
                              capture_output=True, text=True, timeout=timeout)
        if done.returncode or not out.exists():
            raise CommandError(f"bunshin bench graft: kmod/vmtest failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        return json.loads(out.read_text())


def summarize(runs: list[dict]) -> list[dict]:
    """One row per source size: medians over runs of each run's medians, and the range of the per-run values."""
    rows = []
    for i, first in enumerate(runs[0]["results"]):
        per_run = [r["results"][i] for r in runs]

        def col(key: str, per_run: list[dict] = per_run) -> list[float]:
            return [p[key]["median"] for p in per_run]

        ratio = [p["graft_us"]["median"] / p["fork_us"]["median"] for p in per_run]
        rows.append({
            "size_mib": first["size_mib"],
            "graft_ms": statistics.median(col("graft_us")) / 1000,
            "fork_ms": statistics.median(col("fork_us")) / 1000,
            "graft_over_fork": statistics.median(ratio),
            "ratio_range": f"{min(ratio):.2f}-{max(ratio):.2f}",
            "graft_private_kib": statistics.median(col("graft_private_kib")),
            "fork_private_kib": statistics.median(col("fork_private_kib")),
            "pte_kib": statistics.median(col("graft_pte_kib")),
            "fork_pte_kib": statistics.median(col("fork_pte_kib")),
        })
    return rows


COLUMNS = [("size_mib", "source MiB"), ("graft_ms", "graft ms (TCG)"), ("fork_ms", "fork ms (TCG)"),
           ("graft_over_fork", "graft / fork"), ("ratio_range", "ratio range over runs"),
           ("graft_private_kib", "clone private KiB"), ("fork_private_kib", "fork child private KiB"),
           ("pte_kib", "clone page tables KiB"), ("fork_pte_kib", "child page tables KiB")]


def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    sizes = [str(r["size_mib"]) + " MiB" for r in rows]
    x = range(len(rows))
    left.bar([i - 0.2 for i in x], [r["graft_ms"] for r in rows], 0.4, label="graft (module)")
    left.bar([i + 0.2 for i in x], [r["fork_ms"] for r in rows], 0.4, label="fork()")
    left.set_xticks(list(x), sizes)
    left.set_ylabel("ms under QEMU TCG (compare, don't read)")
    left.set_title("time, median over runs")
    left.legend()
    right.bar([i - 0.3 for i in x], [r["graft_private_kib"] for r in rows], 0.2, label="clone private")
    right.bar([i - 0.1 for i in x], [r["fork_private_kib"] for r in rows], 0.2, label="fork child private")
    right.bar([i + 0.1 for i in x], [r["pte_kib"] for r in rows], 0.2, label="clone page tables")
    right.bar([i + 0.3 for i in x], [r["fork_pte_kib"] for r in rows], 0.2, label="child page tables")
    right.set_xticks(list(x), sizes)
    right.set_ylabel("KiB right after")
    right.set_title("memory of what each makes")
    right.legend(fontsize=8)
    fig.suptitle("BunshinFork graft vs fork() of the same source (Debian 6.1 kernel, QEMU TCG, 2 vCPUs)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def command(args) -> int:
    runs = []
    for i in range(args.runs):
        print(f"bench graft: run {i + 1}/{args.runs} (boots the VM: about a minute)", file=sys.stderr, flush=True)
        runs.append(run_once(args.timeout))
    rows = summarize(runs)
    print(markdown_table(rows, COLUMNS))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"runs": runs, "summary": rows}, indent=2) + "\n")
    if args.plot:
        plot(rows, args.plot)
    return 0


def add_arguments(parser) -> None:
    parser.add_argument("--runs", type=int, default=3, help="VM boots, each measuring 7 grafts and 7 forks per size")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a run may take")
    parser.add_argument("--json", type=Path, help="write every run and the summary as JSON here")
    parser.add_argument("--plot", type=Path, help="write a PNG plot here")

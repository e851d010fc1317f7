"""``bunshin bench treefork``: the tree fork (``kmod``) against CRIU 3.17 (``criu``) and a cold start (``cold``) of
the same real workloads, in one boot of the VM.

Owns: running ``kmod/vmtest --treefork-bench`` (which boots Debian's 6.1 kernel under QEMU TCG and runs
``kmod/treefork/bench.py`` there: what each way does and measures is said in that file), and presenting its rows
``{workload, backend, n, ready_ms_p50, freeze_ms_p50, memory_bytes}``: a table, the ratios to CRIU at each N, JSON
and a PNG.
Must never: report an absolute time as a property of real hardware. Under TCG only ratios within one boot mean
anything.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from ..errors import CommandError
from ..report import markdown_table, pyplot

VMTEST = Path(__file__).resolve().parents[2] / "kmod" / "vmtest"
BACKENDS = ("kmod", "criu", "cold")


def run(workloads: str, backends: str, clones: str, memory_mib: int, timeout: float) -> dict:
    """One boot of the VM running the benchmark; its JSON (rows and failures)."""
    with tempfile.TemporaryDirectory(prefix="bunshin-bench-treefork.") as tmp:
        out = Path(tmp) / "treefork.json"
        cmd = [sys.executable, str(VMTEST), "--treefork-bench", str(out), "--memory", str(memory_mib),
               "--timeout", str(timeout),
               "--bench-args", f"--workloads {workloads} --backends {backends} --clones {clones}"]
        # its progress ("vmtest: bench: ...") goes to our stderr as it comes
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=timeout + 600)
        if not out.exists():
            raise CommandError(f"bunshin bench treefork: kmod/vmtest printed no result (exit {done.returncode}):\n"
                               f"{done.stdout[-4000:]}")
        return json.loads(out.read_text())


def ratios(rows: list[dict]) -> list[dict]:
    """kmod and cold against criu, per workload and N: ready p50 and memory."""
    by = {(r["workload"], r["backend"], r["n"]): r for r in rows}
    out = []
    for (workload, backend, n), row in by.items():
        base = by.get((workload, "criu", n))
        if backend == "criu" or base is None:
            continue
        out.append({"workload": workload, "backend": backend, "n": n,
                    "ready_over_criu": row["ready_ms_p50"] / base["ready_ms_p50"],
                    "memory_over_criu": row["memory_bytes"] / base["memory_bytes"] if base["memory_bytes"] > 0
                    else None,
                    "pss_over_criu": row["pss_bytes"] / base["pss_bytes"] if base["pss_bytes"] else None})
    return out


def _mib(v: object) -> str:
    return f"{v / 2**20:.0f} MiB" if isinstance(v, int | float) else "-"


def table(rows: list[dict]) -> str:
    shown = [{**r, "freeze": r["freeze_ms_p50"] if r["freeze_ms_p50"] is not None else "-",
              "memory": _mib(r["memory_bytes"]), "pss": _mib(r["pss_bytes"]),
              "range": f"{min(r['ready_ms']):.0f}-{max(r['ready_ms']):.0f}"} for r in rows]
    return markdown_table(shown, [("workload", "workload"), ("backend", "backend"), ("n", "n"),
                                  ("ready_ms_p50", "ready ms p50"), ("range", "ready range ms"),
                                  ("freeze", "source freeze ms p50"), ("memory", "MemAvailable drop"),
                                  ("pss", "PSS sum")])


def ratio_table(rows: list[dict]) -> str:
    shown = [{**r, "memory_over_criu": r["memory_over_criu"] if r["memory_over_criu"] is not None else "-",
              "pss_over_criu": r["pss_over_criu"] if r["pss_over_criu"] is not None else "-"} for r in ratios(rows)]
    return markdown_table(shown, [("workload", "workload"), ("backend", "backend"), ("n", "n"),
                                  ("ready_over_criu", "ready / criu"), ("memory_over_criu", "memory / criu"),
                                  ("pss_over_criu", "PSS / criu")])


def plot(rows: list[dict], path: Path, failures: list[dict] | None = None) -> None:
    """Per workload: the ready times of its largest N per way, and memory against N; a way that failed is named."""
    plt = pyplot()
    names = sorted({r["workload"] for r in rows})
    fig, axes = plt.subplots(len(names), 2, figsize=(11, 3.8 * len(names)), squeeze=False)
    for (left, right), name in zip(axes, names, strict=True):
        mine = [r for r in rows if r["workload"] == name]
        present = [b for b in BACKENDS if any(r["backend"] == b for r in mine)]
        for i, backend in enumerate(present):
            largest = max((r for r in mine if r["backend"] == backend), key=lambda r: r["n"])
            samples = largest["ready_ms"]
            left.boxplot([[s / 1000 for s in samples]], positions=[i], widths=0.5)
        left.set_xticks(range(len(present)), present)
        failed = [f["backend"] for f in failures or [] if f["workload"] == name]
        if failed:
            left.text(0.02, 0.02, "failed: " + ", ".join(failed) + " (see the JSON)", transform=left.transAxes,
                      fontsize=8, color="tab:red")
        left.set_yscale("log")
        left.set_ylabel("fork / restore / start to ready, s (TCG)")
        left.set_title(f"{name}: time to a working instance")
        for backend in present:
            series = sorted((r for r in mine if r["backend"] == backend), key=lambda r: r["n"])
            right.plot([r["n"] for r in series], [r["memory_bytes"] / 2**30 for r in series], marker="o",
                       label=backend)
        right.set_xlabel("instances")
        right.set_ylabel("guest MemAvailable drop, GiB")
        right.set_title(f"{name}: memory of N instances")
        right.legend()
    fig.suptitle("Tree fork (kmod) vs CRIU 3.17 restore vs cold start, each workload's ways in one VM boot\n"
                 "(Debian 6.1, QEMU TCG, 2 vCPUs)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def command(args) -> int:
    print("bench treefork: boots the VM; the workloads start under emulation (tens of seconds each) and every way "
          f"makes {max(int(n) for n in args.clones.split(','))} instances of each: allow up to an hour",
          file=sys.stderr, flush=True)
    result = run(args.workloads, args.backends, args.clones, args.memory, args.timeout)
    rows = result["rows"]
    if rows:
        print(table(rows))
        print()
        print(ratio_table(rows))
    for failure in result["failures"]:
        print(f"{failure['workload']} {failure['backend']} FAILED: {failure['error']}", file=sys.stderr)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**result, "ratios": ratios(rows)}, indent=2) + "\n")
    if args.plot and rows:
        plot(rows, args.plot, result["failures"])
    # a baseline failing (CRIU cannot dump every workload) is a result, shown and kept in the JSON
    return 1 if any(f["backend"] == "kmod" for f in result["failures"]) or not rows else 0


def add_arguments(parser) -> None:
    parser.add_argument("--workloads", default="chromium,xdesktop",
                        help="comma-separated: chromium (headless Chromium on the web shop's page), xdesktop (Xvfb, "
                             "openbox and an X client), calc (LibreOffice Calc with a sheet, on Xvfb and openbox); "
                             "default chromium,xdesktop")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated, of kmod, criu, cold")
    parser.add_argument("--clones", default="1,4,16", help="the Ns at which memory is read (default 1,4,16)")
    parser.add_argument("--memory", type=int, default=12288, help="the guest's MiB (default 12288: 16 restores of "
                                                                  "Chromium are 16 private copies)")
    parser.add_argument("--timeout", type=float, default=5400.0, help="seconds the VM may run (default 5400)")
    parser.add_argument("--json", type=Path, help="write the rows, ratios and failures as JSON here")
    parser.add_argument("--plot", type=Path, help="write a PNG plot here")

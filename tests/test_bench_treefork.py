"""``bunshin bench treefork``'s host side: the ratios to CRIU it reports, its table and plot, and that a VM run
without a result is an error naming what the harness printed (the measuring itself runs in the VM:
``kmod/treefork/bench.py``, by ``kmod/vmtest --treefork-bench``)."""

from __future__ import annotations

import json

import pytest

from bunshin.engine.bench import treefork
from bunshin.engine.errors import CommandError
from tests.test_kmod import vmtest


def row(workload: str, backend: str, n: int, ready: float, memory: int, freeze: float | None = 10.0) -> dict:
    return {"workload": workload, "backend": backend, "n": n, "ready_ms_p50": ready, "freeze_ms_p50": freeze,
            "memory_bytes": memory, "pss_bytes": memory // 2, "ready_ms": [ready * 0.9, ready, ready * 1.2],
            "freeze_ms": [] if freeze is None else [freeze]}


ROWS = [row("chromium", "kmod", 1, 500.0, 40 << 20), row("chromium", "criu", 1, 10_000.0, 300 << 20),
        row("chromium", "cold", 1, 30_000.0, 320 << 20, None),
        row("chromium", "kmod", 16, 520.0, 200 << 20), row("chromium", "criu", 16, 11_000.0, 4800 << 20),
        row("xdesktop", "kmod", 1, 100.0, 8 << 20)]


def test_ratios_are_to_criu_at_the_same_workload_and_n():
    got = {(r["workload"], r["backend"], r["n"]): r for r in treefork.ratios(ROWS)}
    assert set(got) == {("chromium", "kmod", 1), ("chromium", "cold", 1), ("chromium", "kmod", 16)}  # no criu row
    assert got["chromium", "kmod", 1]["ready_over_criu"] == pytest.approx(0.05)
    assert got["chromium", "kmod", 16]["memory_over_criu"] == pytest.approx(200 / 4800)
    assert got["chromium", "cold", 1]["ready_over_criu"] == pytest.approx(3.0)


def test_the_table_and_the_plot_show_every_row(tmp_path):
    text = treefork.table(ROWS)
    assert text.count("\n") == len(ROWS) + 1
    assert "| chromium | criu | 16 | 11000.00 | 9900-13200 | 10.00 | 4800 MiB | 2400 MiB |" in text
    assert "| chromium | cold | 1 | 30000.00 | 27000-36000 | - |" in text
    assert "| chromium | kmod | 1 | 0.05 | 0.13 | 0.13 |" in treefork.ratio_table(ROWS)
    treefork.plot(ROWS, tmp_path / "t.png", [{"workload": "chromium", "backend": "criu", "error": "dump failed"}])
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_harness_finds_the_tree_fork_benchmarks_json_between_its_own_markers():
    result = {"rows": ROWS, "failures": []}
    console = (f"boot\n{vmtest.BENCH_BEGIN}\n{{\"graft\": 1}}\n{vmtest.BENCH_END}\n{vmtest.TFBENCH_BEGIN}\n"
               f"# bench: chromium kmod 1/1: ready 500 ms\n{json.dumps(result)}\n{vmtest.TFBENCH_END}\n")
    assert vmtest.bench_json(console, vmtest.TFBENCH_BEGIN, vmtest.TFBENCH_END) == result
    assert vmtest.bench_json(console) == {"graft": 1}
    assert vmtest.bench_json(console.split(vmtest.TFBENCH_END)[0], vmtest.TFBENCH_BEGIN, vmtest.TFBENCH_END) is None


def test_a_vm_run_without_a_result_is_an_error_that_shows_what_the_harness_said(tmp_path, monkeypatch):
    harness = tmp_path / "vmtest"
    harness.write_text("import sys\nprint('vmtest: FAIL: the guest ran past 10 s and was killed')\nsys.exit(1)\n")
    monkeypatch.setattr(treefork, "VMTEST", harness)
    with pytest.raises(CommandError, match="printed no result .exit 1.:\nvmtest: FAIL: the guest ran past 10 s"):
        treefork.run("chromium", "kmod", "1", 2048, 10)

"""The kernel module's host-side checks: the VM harness cannot pass vacuously, checkpatch is clean, and the doctor
says where the module can load (the module itself is tested inside the VM by ``kmod/vmtest``, which the README's
test command runs after this suite)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bunshin.envs.runtime import kmod_probe

REPO = Path(__file__).resolve().parents[1]
VMTEST = REPO / "kmod" / "vmtest"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "kmod"


def load_vmtest():
    loader = importlib.machinery.SourceFileLoader("bunshin_vmtest", str(VMTEST))
    spec = importlib.util.spec_from_loader("bunshin_vmtest", loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bunshin_vmtest"] = module     # its dataclasses look their module up
    loader.exec_module(module)
    return module


vmtest = load_vmtest()


def console(tap: str, ended: bool = True) -> str:
    """What a guest prints: boot noise, then the selftests' TAP between the markers."""
    return f"[    1.0] booting\n{vmtest.BEGIN}\n{tap}\n" + (f"{vmtest.END}\n" if ended else "") + "reboot: Power down\n"


PASSING = """TAP version 13
1..3
ok 1 selftests: bunshin: module loads and /dev/bunshin exists
# selftests: bunshin: graft_api
# TAP version 13
# 1..1
# ok 1 API negotiates
ok 2 selftests: bunshin: graft_api
ok 3 selftests: bunshin: module unloads"""


def test_a_run_where_everything_passes_passes():
    verdict = vmtest.judge(console(PASSING))
    assert verdict.ok, verdict.problems


@pytest.mark.parametrize(("tap", "ended", "problem"), [
    (PASSING.replace("ok 2 selftests: bunshin: graft_api", "not ok 2 selftests: bunshin: graft_api # exit=1"), True,
     "not ok 2"),
    (PASSING.replace("# ok 1 API negotiates", "# not ok 1 API negotiates"), True, "inside a selftest: not ok 1"),
    (PASSING.replace("ok 2 selftests: bunshin: graft_api", "ok 2 selftests: bunshin: graft_api # SKIP"), True,
     "skipped: 2"),
    (PASSING.replace("# ok 1 API negotiates", "# ok 1 API negotiates # SKIP no device"), True,
     "inside a selftest: ok 1 API negotiates # SKIP"),
    (PASSING.replace("1..3", "1..4"), True, "3 results for a plan of 4"),
    (PASSING.split("ok 2")[0], False, "stopped before the end"),
    (PASSING.replace("1..3\n", ""), True, "no TAP plan"),
], ids=["top-level failure", "failure inside a selftest", "top-level skip", "skip inside a selftest",
        "a result missing", "the guest died mid-run", "no plan"])
def test_the_harness_fails_a_run_that_did_not_fully_pass(tap, ended, problem):
    verdict = vmtest.judge(console(tap, ended))
    assert not verdict.ok
    assert any(problem in p for p in verdict.problems), verdict.problems


def test_a_guest_that_never_started_the_selftests_fails():
    verdict = vmtest.judge("Kernel panic - not syncing: VFS: Unable to mount root fs\n")
    assert not verdict.ok and "never started" in verdict.problems[0]


def test_every_selftest_source_is_one_the_harness_runs():
    names = vmtest.selftest_names()
    assert set(names) == {"graft_api", "graft_faults", "graft_hold", "graft_memory", "graft_namespaces",
                          "graft_remap", "graft_restart", "graft_sysv", "graft_threads"}
    # and every tree-fork workload, one TAP line each
    assert set(vmtest.TREEFORK_WORKLOADS) == set(_workloads())


def _workloads() -> list[str]:
    text = (VMTEST.parent / "treefork" / "workloads.py").read_text()
    block = text[text.index("WORKLOADS: dict"):]
    return re.findall(r'"(\w+)": workload_', block)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the VM harness installs Debian packages as root")


@needs_root
def test_the_harness_fails_when_a_selftest_in_the_vm_fails_skips_or_crashes():
    """A real boot with three broken selftests beside a real one: the harness exits 1 and names each."""
    done = subprocess.run([sys.executable, str(VMTEST), "--only", "graft_api", "--extra",
                           str(FIXTURES / "graft_fails.c"), str(FIXTURES / "graft_skips.c"),
                           str(FIXTURES / "graft_crashes.c")], capture_output=True, text=True, timeout=900)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "ok 1 selftests: bunshin: the host's userland runs in the guest" in done.stdout  # Python over 9p
    assert "ok 2 selftests: bunshin: a kernel without a symbol it needs: the module refuses to load" in done.stdout
    assert "ok 4 selftests: bunshin: graft_api" in done.stdout      # the real selftest ran and passed
    assert "FAIL: not ok 5 selftests: bunshin: graft_fails" in done.stderr
    assert "FAIL: inside a selftest: not ok 2 this one fails on purpose" in done.stderr
    assert "FAIL: skipped: 6 selftests: bunshin: graft_skips" in done.stderr
    assert "FAIL: not ok 7 selftests: bunshin: graft_crashes" in done.stderr
    assert "module unloads" in done.stdout


@needs_root
def test_checkpatch_strict_is_clean_on_the_module():
    done = subprocess.run([str(REPO / "kmod" / "checkpatch")], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "clean (--strict)" in done.stdout


def test_the_module_symbols_come_from_its_own_table():
    symbols = kmod_probe.required_symbols()
    assert symbols[0] == "kallsyms_lookup_name"
    assert {"mm_init", "dup_mmap", "mm_cachep", "mm_access", "switch_mm"} <= set(symbols)
    table = (REPO / "kmod" / "symbols.c").read_text()
    # every named entry, and the two lookups (the harness's test-only entry names no real symbol)
    assert len(symbols) == len(re.findall(r'\tBUNSHIN_SYM\(\w+, "', table)) + 2
    assert "BUNSHIN_TEST_MISSING_SYMBOL" not in symbols


@pytest.mark.parametrize(("facts", "can_load", "says"), [
    (dict(modules=False, release="6.18.44-fc", headers=False, missing=[], loaded=False), False,
     "built without loadable modules"),
    (dict(modules=True, release="6.12.9-amd64", headers=True, missing=[], loaded=False), False,
     "built for Linux 6.1 LTS and this kernel is 6.12.9-amd64"),
    (dict(modules=True, release="6.1.0-57-amd64", headers=True, missing=["dup_mmap"], loaded=False), False,
     "kernel symbol dup_mmap not in /proc/kallsyms"),
    (dict(modules=True, release="6.1.0-57-amd64", headers=False, missing=[], loaded=False), False,
     "apt-get install linux-headers-6.1.0-57-amd64"),
    (dict(modules=True, release="6.1.0-57-amd64", headers=True, missing=[], loaded=False), True, "can load"),
    (dict(modules=True, release="6.1.0-57-amd64", headers=True, missing=[], loaded=True), True, "loaded"),
], ids=["no modules", "another kernel", "a symbol missing", "no headers", "can load", "loaded"])
def test_the_doctor_verdict_on_the_module(facts, can_load, says):
    verdict = kmod_probe.judge(**facts)
    assert verdict.can_load is can_load
    assert says in verdict.detail
    assert ("kmod/vmtest" in verdict.detail) is (not can_load)


def test_the_doctor_on_this_host_says_whether_the_module_loads_and_where_it_is_tested():
    from bunshin.envs.runtime.doctor import diagnose

    report = diagnose()
    check = next(c for c in report.checks if c.name == "bunshin kernel module")
    if not os.path.exists("/proc/modules"):     # this machine and CI's: a kernel without loadable modules
        assert not check.ok
        assert "built without loadable modules" in check.detail and "kmod/vmtest" in check.detail
    ok, detail = report.backends["kmod"]  # the tree fork: a backend where the module is loaded
    if not os.path.exists("/dev/bunshin"):
        assert not ok and "/dev/bunshin" in detail, detail
    else:
        assert ok == (detail == "ready"), detail

"""Both cgroup versions are understood: the layout is read from mountinfo (v1 here, v2 elsewhere)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from bunshin.envs.runtime.cgroups import Cgroup, CgroupLayout, CgroupUnavailable

V1 = """\
30 25 0:26 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory
31 25 0:27 / /sys/fs/cgroup/pids rw,relatime shared:10 - cgroup cgroup rw,pids
32 25 0:28 / /sys/fs/cgroup/freezer rw,relatime shared:11 - cgroup cgroup rw,freezer
33 25 0:29 / /sys/fs/cgroup/unified rw,relatime shared:12 - cgroup2 cgroup2 rw
"""
V2 = "29 25 0:26 / {root} rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"


def test_v1_layout() -> None:
    layout = CgroupLayout.detect(V1)
    assert layout.version == 1
    assert layout.roots["memory"] == Path("/sys/fs/cgroup/memory") and layout.has_freezer
    assert set(layout.hierarchies()) == {"memory", "pids", "freezer"}


def test_v2_layout(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
    layout = CgroupLayout.detect(V2.format(root=tmp_path))
    assert layout.version == 2
    assert layout.hierarchies() == {"unified": tmp_path}


def test_v2_without_memory_is_not_enough(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("hugetlb\n")
    with pytest.raises(CgroupUnavailable, match="memory and pids"):
        CgroupLayout.detect(V2.format(root=tmp_path))


CGROUP_V1_MAGIC, CGROUP_V2_MAGIC = 0x27E0EB, 0x63677270  # statfs(2) f_type of cgroup and cgroup2 file systems


def _fs_magic(path: Path) -> int:
    out = subprocess.run(["stat", "-f", "-c", "%t", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.strip(), 16)


def test_this_hosts_controllers_are_found_where_the_kernel_mounts_them() -> None:
    """Checked against the kernel, not against our own parser: each root found is a mounted cgroup file system of
    the detected version, and offers the files the runtime writes (limits, counters, freezer)."""
    layout = CgroupLayout.detect()
    magic = CGROUP_V2_MAGIC if layout.version == 2 else CGROUP_V1_MAGIC
    for controller, root in layout.roots.items():
        assert _fs_magic(root) == magic, f"{controller} root {root} is not a cgroup v{layout.version} mount"
        assert (root / "cgroup.procs").exists()
    memory, pids = layout.roots["memory"], layout.roots["pids"]
    if layout.version == 1:
        assert (memory / "memory.limit_in_bytes").exists() and (memory / "memory.oom_control").exists()
        assert layout.has_freezer == (layout.roots.get("freezer") is not None)
        assert len({memory, pids}) == 2  # v1: one hierarchy per controller
    else:
        assert memory == pids and {"memory", "pids"} <= set((memory / "cgroup.controllers").read_text().split())
    # what the runtime relies on, in a group of our own
    group = Cgroup(layout, f"bunshin-test-{os.getpid()}").create(delegate=True)
    try:
        child = group.child("ws-probe").create()
        child.set_limits(64 << 20, 16)
        assert child.memory_charge() >= 0 and child.oom_kills() == 0 and child.pids_limit_hits() == 0
        child.freeze(True)
        child.freeze(False)
    finally:
        group.remove()
    assert not group.path("memory").exists()

"""Both cgroup versions are understood: the layout is read from mountinfo (v1 here, v2 elsewhere)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bunshin.envs.runtime.cgroups import CgroupLayout, CgroupUnavailable

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


def test_this_host() -> None:
    layout = CgroupLayout.detect()
    assert layout.version in (1, 2)

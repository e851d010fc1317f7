"""A run holds the kernel's ``favordynmods`` cgroup mode while it lives (a named cgroup v1 hierarchy mounted in its
directory) and gives it back at its close; a kernel that refuses the mount leaves the run going without it. A
killed engine's mount goes with its run (tests/test_leaks.py: ``leftovers`` counts every mount below a run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bunshin.envs import WorkspaceRuntime
from bunshin.envs.runtime import fast_moves
from bunshin.envs.runtime.fast_moves import FastMoves


def mounts_below(path: Path) -> list[str]:
    return [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(path) in line]


@pytest.mark.asyncio
async def test_a_run_holds_favordynmods_while_it_lives(state_dir: Path) -> None:
    async with WorkspaceRuntime(state_dir=state_dir) as rt:
        [mount] = mounts_below(rt.run_dir / "favordynmods")
        assert " cgroup " in mount and "favordynmods" in mount and "name=bunshin-favordynmods" in mount, mount
        assert rt.fast_moves.held and "held" in rt.fast_moves.detail
        ws = await rt.create()  # its host is moved into its cgroups as ever
        clone = await ws.fork()
        assert clone.last_fork is not None and list(clone.last_fork.clone_steps_s)[0] == "cgroup"
    assert mounts_below(rt.run_dir) == [] and not rt.run_dir.exists()


def test_a_kernel_that_refuses_the_option_leaves_the_run_without_it(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fast_moves, "OPTIONS", "none,name=bunshin-refused,no_such_option_bunshin")
    moves = FastMoves(tmp_path)
    assert moves.hold() is False and not moves.held
    assert "not available (Invalid argument)" in moves.detail
    assert not (tmp_path / "favordynmods").exists() and mounts_below(tmp_path) == []
    moves.give_back()  # nothing held: nothing to do

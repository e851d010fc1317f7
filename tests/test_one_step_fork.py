"""One-step clones (``fork/sibling.py``): a clone forked as its source's sibling is the nursery's child at once,
carries CPython's after-fork work and glibc's thread id, and a process that ever started a thread (or a run that
asks for it) forks in two steps instead; in real workspaces the live fork takes one step, chains too."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bunshin.envs import ToolCall, WorkspaceRuntime
from bunshin.envs.records import Limits

from .conftest import heap_app, workspace_groups, workspace_procs

# The reaper (a child subreaper, as the nursery is) starts a middle process, which forks a clone with
# ``fork_to_reaper``; the clone reports what it sees on a pipe.
REAPER = textwrap.dedent("""
    import ctypes, json, os, subprocess, sys
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    middle = subprocess.run([sys.executable, "-c", sys.argv[1], str(os.getpid())], capture_output=True, text=True)
    clone = json.loads(middle.stdout.splitlines()[-1])
    os.waitpid(clone["pid"], 0)  # ours to reap: the clone's parent is this process
    print(json.dumps({**clone, "reaper": os.getpid(), "middle_pid": int(middle.stdout.splitlines()[0]),
                      "middle_status": middle.returncode}))
""")
MIDDLE = textwrap.dedent("""
    import json, os, random, signal, sys, threading, time
    import ctypes
    from bunshin.envs.runtime.fork.sibling import _tid_address, clone_pid, fork_to_reaper
    if {thread}:
        t = threading.Thread(target=lambda: None); t.start(); t.join()
    print(os.getpid(), flush=True)
    ran = []
    os.register_at_fork(after_in_child=lambda: ran.append("hook"))
    r, w = os.pipe()
    before = random.random.__self__.getstate()
    forking = fork_to_reaper(int(sys.argv[1]))
    pid, one_step = forking.pid, forking.one_step
    if pid == 0:
        deadline = time.monotonic() + 10
        while os.getppid() != int(sys.argv[1]) and time.monotonic() < deadline:  # two steps: once orphaned
            time.sleep(0.001)
        got = []
        signal.signal(signal.SIGUSR1, lambda *_: got.append(os.getpid()))
        signal.raise_signal(signal.SIGUSR1)  # glibc signals the thread it believes it is
        os.write(w, json.dumps({{"pid": os.getpid(), "ppid": os.getppid(), "one_step": one_step, "hooks": ran,
                                "reseeded": random.random.__self__.getstate() != before, "signalled": got,
                                "native_id": threading.get_native_id(),
                                "glibc_tid": ctypes.c_int.from_address(_tid_address()).value}}).encode())
        os._exit(0)
    os.close(w)
    report = json.loads(os.read(r, 65536))
    if not one_step:
        os.waitpid(pid, 0)  # the middle process of two steps
    print(json.dumps({{**report, "told": clone_pid(forking)}}))
""")


def fork_report(tmp_path: Path, *, thread: bool) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", REAPER, MIDDLE.format(thread=thread)], capture_output=True,
                         text=True, timeout=60, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def test_a_clone_forked_in_one_step_is_the_reapers_child_with_the_interpreters_fork_work(tmp_path: Path) -> None:
    r = fork_report(tmp_path, thread=False)
    assert r["one_step"] is True and r["ppid"] == r["reaper"] and r["middle_status"] == 0 and r["told"] == r["pid"]
    assert r["hooks"] == ["hook"] and r["reseeded"] is True  # os.register_at_fork hooks, random's reseed
    assert r["signalled"] == [r["pid"]] and r["native_id"] == r["pid"]
    assert r["glibc_tid"] == r["pid"]  # the thread id in glibc's thread block is the clone's, not its source's


def test_a_process_that_ever_started_a_thread_forks_in_two_steps_and_the_clone_still_lands_on_the_reaper(
        tmp_path: Path) -> None:
    r = fork_report(tmp_path, thread=True)
    assert r["one_step"] is False and r["ppid"] == r["reaper"] and r["told"] == r["pid"]  # the middle told it
    assert r["hooks"] == ["hook", "hook"] and r["signalled"] == [r["pid"]]  # a fork, and its child's


def nursery_child(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


@pytest.mark.asyncio
async def test_a_live_fork_takes_one_step_chains_too_and_a_run_may_ask_for_two(make_runtime) -> None:
    runtime: WorkspaceRuntime = await make_runtime()
    source = await runtime.create(heap_app())
    await source.execute(ToolCall(name="set", args={"key": "k", "value": "v"}))
    clone = await source.fork()
    grandchild = await clone.fork()
    for ws in (clone, grandchild):
        assert ws.last_fork is not None and ws.last_fork.one_step, ws.id
        assert nursery_child(ws.pid) == runtime.nursery.pid
        assert (await ws.execute(ToolCall(name="get", args={"key": "k"}))).output == "'v'"
        assert (await ws.execute(ToolCall(name="shell", args={"cmd": "echo ok"}))).output == "ok\n"
    burner = await source.fork()  # the CPU of a closed host's life, its agents' included (reaped by it)
    burn = "python3 -c 'import time\nwhile time.process_time() < 0.4: pass'"  # 0.4 s of CPU, however loaded
    assert (await burner.execute(ToolCall(name="shell", args={"cmd": burn}))).exit_code == 0
    await burner.close()
    assert runtime.nursery.exit_cpu_ns(burner.pid) is not None
    assert runtime.nursery.exit_cpu_ns(burner.pid) >= 400_000_000  # type: ignore[operator]
    two = await make_runtime(one_step_clones=False, limits=Limits(memory_bytes=1 << 30, pids=128))
    source2 = await two.create(heap_app())
    clone2 = await source2.fork()
    assert clone2.last_fork is not None and not clone2.last_fork.one_step
    assert nursery_child(clone2.pid) == two.nursery.pid


@pytest.mark.asyncio
@pytest.mark.parametrize("fault", ["clone.before_cgroup:hang", "clone.before_cgroup:exit"])
@pytest.mark.parametrize("one_step", [True, False])
async def test_a_clone_that_never_reaches_its_cgroup_is_killed_and_nothing_is_left(make_runtime, fault: str,
                                                                                   one_step: bool) -> None:
    """A clone starts in its source's cgroup: one that hangs (or dies) before it moves to its own is found by its
    pid (``Forked.clone_pid``; after two steps the middle process tells it), not by its cgroup, and the source
    runs on alone."""
    from bunshin.envs import ForkFailed

    from .conftest import pool_layers

    runtime: WorkspaceRuntime = await make_runtime(faults=[fault], start_timeout_s=3.0, one_step_clones=one_step)
    source = await runtime.create(heap_app())
    layers = set(pool_layers(runtime))
    with pytest.raises(ForkFailed):
        await source.fork()
    assert workspace_procs(runtime) == [source.pid]  # the clone is gone: neither in its source's cgroup nor its own
    assert set(pool_layers(runtime)) == layers and list(runtime.workspaces) == [source.id]
    assert workspace_groups(runtime) == [f"ws-{source.id}"]
    assert (await source.execute(ToolCall(name="shell", args={"cmd": "echo alive"}))).output == "alive\n"

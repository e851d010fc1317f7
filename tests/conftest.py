"""Shared fixtures: a real workspace runtime per test (root, namespaces, btrfs, cgroups), leak checks after every
test that starts one, a loop watchdog on every async test, every async test on both asyncio and uvloop, and
``cancel_at`` for cancelling a coroutine at a named await point."""

from __future__ import annotations

import asyncio
import concurrent.futures
import faulthandler
import os
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
import uvloop

from bunshin.envs import AppSpec, Limits, Workspace, WorkspaceRuntime
from bunshin.envs.runtime import await_points
from bunshin.envs.runtime.host_workspace import HostWorkspace
from bunshin.envs.runtime.layers import DUMPS
from bunshin.envs.runtime.nursery import HOLDER_NAME
from bunshin.envs.runtime.protocol import Ping, Pong
from bunshin.envs.runtime.shells import HOLDERS
from tests.quiet import settled  # absolute: tests/test_watchdog.py runs a copy of this file

HEAP_APP = "bunshin.envs.runtime.heap_app:HeapApp"


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every async test runs under the loop watchdog (a test that blocks the event loop fails)."""
    for item in items:
        if item.get_closest_marker("asyncio") is not None and "loop_watchdog" not in getattr(item, "fixturenames", ()):
            item.fixturenames.append("loop_watchdog")  # type: ignore[attr-defined]


def heap_app(size: int = 16 << 20) -> AppSpec:
    return AppSpec(target=HEAP_APP, kwargs={"size_bytes": size})


# Every process this test session starts inherits this marker, so the leak check sees only our own processes and
# two test sessions (say, two checkouts) can run on one machine at once.
SESSION_MARKER = f"BUNSHIN_TEST_SESSION={os.getpid()}-{time.time_ns()}"
os.environ["BUNSHIN_TEST_SESSION"] = SESSION_MARKER.split("=", 1)[1]
# Test-only applications (tests/apps) are imported by workspace hosts, which inherit the environment; the
# repository root is among the paths the runtime binds into workspaces for the host's imports.
REPO_ROOT = str(Path(__file__).resolve().parent.parent)
os.environ["PYTHONPATH"] = os.pathsep.join([REPO_ROOT, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])


def live_processes() -> list[tuple[int, bytes, str]]:
    """(pid, command line, state letter) of every process now, zombies included."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            found.append((int(entry.name), cmd, state))
    return found


def host_processes(shells: bool = True) -> list[int]:
    """Workspace hosts and nurseries started by this test session (matched by program and session marker), and
    unless ``shells`` is False the prepared shells' holders (forks of a nursery, named ``HOLDER_NAME``: a live
    run makes new ones as its forks take them)."""
    pids = []
    for pid, cmd, _ in live_processes():
        if b"bunshin.envs.runtime.host" in cmd or b"bunshin.envs.runtime.nursery" in cmd:
            if not shells and _comm(pid) == HOLDER_NAME:
                continue
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if SESSION_MARKER.encode() in environ:
                pids.append(pid)
    return pids


def _comm(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/comm").read_bytes().strip()
    except OSError:
        return b""


def leftovers(run_id: str, run_dir: Path, ignore: frozenset[int] = frozenset()) -> list[str]:
    """Everything of run ``run_id`` still present: processes, mounts, cgroups, its directory. Processes are
    matched by program (hosts, nurseries), so ``ignore`` names those of a run that is still live."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        if str(run_dir) in line:
            found.append(f"mount {line.split()[4]}")
    for root in Path("/sys/fs/cgroup").iterdir():
        if (root / f"bunshin-{run_id}").exists():
            found.append(f"cgroup {root / f'bunshin-{run_id}'}")
    if run_dir.exists():
        found.append(f"directory {run_dir}")
    if (Path("/run/bunshin/engines") / run_id).exists():
        found.append(f"engine record /run/bunshin/engines/{run_id}")
    found += [f"host process {pid}" for pid in host_processes() if pid not in ignore]
    found += [f"unreaped child {pid}" for pid in zombie_children()]
    return found


def zombie_children() -> list[int]:
    """Dead children of this process nobody reaped (the engine is a subreaper: orphans land here)."""
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                state, ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
            except OSError:
                continue
            if state == "Z" and int(ppid) == me:
                found.append(int(entry.name))
    return found


async def assert_no_leaks(rt: WorkspaceRuntime, timeout: float = 5.0) -> None:
    left = await settled(lambda: leftovers(rt.run_id, rt.run_dir), timeout)  # exiting hosts, the kernel's cgroups
    assert not left, f"run {rt.run_id} left behind: {left}"


@pytest.fixture
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Not under /tmp's tmpfs rules, and never shared with a real run's /var/lib/bunshin.
    return Path(os.environ.get("BUNSHIN_TEST_STATE_DIR", "/var/lib/bunshin-test"))


@pytest_asyncio.fixture
async def make_runtime(state_dir: Path, loop_watchdog: None) -> AsyncIterator[Callable[..., WorkspaceRuntime]]:
    """Factory: ``rt = await make_runtime(backend=..., limits=...)``; every runtime is closed and leak-checked."""
    made: list[WorkspaceRuntime] = []

    async def factory(**kwargs: object) -> WorkspaceRuntime:
        kwargs.setdefault("state_dir", state_dir)
        kwargs.setdefault("limits", Limits(memory_bytes=2 << 30, pids=256, command_timeout_s=30))
        rt = WorkspaceRuntime(**kwargs)  # type: ignore[arg-type]
        made.append(rt)
        await rt.start()
        return rt

    yield factory  # type: ignore[misc]
    for rt in made:
        await rt.close()
    for rt in made:
        await assert_no_leaks(rt)


@pytest_asyncio.fixture
async def runtime(make_runtime: Callable[..., object]) -> WorkspaceRuntime:
    return await make_runtime()  # type: ignore[misc]


def workspace_groups(rt: WorkspaceRuntime) -> list[str]:
    """The cgroups below the run's that are workspaces', sorted: the prepared shells' (``shells.py``) are not."""
    shells = rt.hosts.shells.groups() if rt.hosts is not None else set()
    return sorted(p.name for p in rt.cgroup.path("memory").iterdir() if p.is_dir() and p.name not in shells)


def workspace_procs(rt: WorkspaceRuntime) -> list[int]:
    """The run's processes, sorted, but the holders the prepared shells account for (``ShellPool.holders``: the
    ready shells', those being ended; every holder while a shell is being made, its pid unknown yet). A holder
    nobody accounts for (a taken shell's, never ended) is listed: a leak."""
    if rt.hosts is None:
        return sorted(rt.cgroup.procs())
    known = rt.hosts.shells.holders()
    held = set(rt.cgroup.child(HOLDERS).procs()) if known is None else known
    return sorted(p for p in rt.cgroup.procs() if p not in held)


def pool_layers(rt: WorkspaceRuntime) -> list[str]:
    """The layers in the run's pool (not the dumps' tmpfs), sorted."""
    return sorted(p.name for p in rt.layers.root.iterdir() if p.is_dir() and p.name != DUMPS)


async def ping(ws: Workspace) -> Pong:
    """Ask the workspace's host who it is (the protocol's ``Ping``): a check that it serves, and its pid."""
    assert isinstance(ws, HostWorkspace)
    reply = await ws.request(Ping())
    return ws.expect(reply, Pong)


# Await points that a run's own tasks pass as well as the call under test (the prepared shells' refill asks the
# nursery too, ``shells.py``): a test listing the points a call passes leaves these out.
SHARED_POINTS = frozenset({"shell.make", "nursery.request.sent"})


def cancel_at(task: asyncio.Future[object], name: str, occurrence: int = 1) -> await_points.Hook:
    """A hook for ``await_points.hook``: cancel ``task`` (the caller under test) the ``occurrence``-th time the code
    reaches the await point ``name``; the cancellation lands on the caller's next await, as a caller's would."""
    seen = 0

    def hook(reached: str) -> None:
        nonlocal seen
        if reached == name:
            seen += 1
            if seen == occurrence:
                task.cancel()

    return hook


def _cpu_wait_s() -> float:
    """How long the calling thread has waited, runnable, for a CPU (``schedstat``'s run-queue time); 0.0 where the
    kernel does not say."""
    try:
        return int(Path("/proc/thread-self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


DUMP_AFTER_S = 0.75  # a heartbeat this late has the loop thread's stack dumped (the test fails from 1 s)


def _thread_in_dump(dump: str, ident: int) -> str:
    """The thread ``ident``'s stack (most recent call first) in ``faulthandler``'s ``dump``, whose threads each start
    with a line "Thread 0x... (most recent call first):" followed by their frames' lines."""
    frames: list[str] = []
    ours = False
    for line in dump.splitlines():
        words = line.split()
        if words[:1] in (["Thread"], ["Current"]):
            ours = any(w.startswith("0x") and int(w, 16) == ident for w in words)
        elif ours and line.startswith("  "):
            frames.append(line)
    return "\n".join(frames[:15])


def _steal_s() -> float:
    """The most time the hypervisor has taken from any one of our virtual CPUs (``/proc/stat``'s steal), seconds:
    while a vCPU is not run, nothing on it is, our code included."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
        return max(int(line.split()[8]) for line in lines if line.startswith("cpu") and line[3].isdigit()) / \
            os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


@pytest_asyncio.fixture
async def loop_watchdog() -> AsyncIterator[None]:
    """Fails an async test during which the event loop was blocked for more than a second, naming where the loop's
    thread was when it was blocked longest.

    Blocked means our code held the loop: running, or sleeping in a call. Time the loop's thread spent runnable but
    waiting for a CPU (two cores shared with a batch of busy browsers), and time the hypervisor did not run a
    virtual CPU (steal), is not the code's doing and is not counted; it is reported beside. Where it was comes from
    ``faulthandler``'s timer, armed for every heartbeat: its C thread dumps the stacks without the GIL, so a call
    that holds the GIL (a C extension's, a fork) is named too."""
    worst = starved = 0.0
    stop = False
    loop_thread = threading.get_ident()
    dumps = tempfile.TemporaryFile()  # noqa: SIM115 (faulthandler writes to its descriptor)
    longest = ""  # the loop thread's stack, dumped during the worst heartbeat

    async def beat() -> None:
        nonlocal worst, starved, longest
        while not stop:
            before = time.monotonic()
            waited, stolen = _cpu_wait_s(), _steal_s()
            dumped = os.fstat(dumps.fileno()).st_size
            faulthandler.dump_traceback_later(DUMP_AFTER_S, file=dumps)
            await asyncio.sleep(0.05)
            elapsed = time.monotonic() - before
            waited = _cpu_wait_s() - waited + max(0.0, _steal_s() - stolen)
            # after the measurement: cancelling joins the timer's thread, which a starved machine may run late
            faulthandler.cancel_dump_traceback_later()
            starved = max(starved, waited)
            blocked = elapsed - 0.05 - waited
            if blocked > worst:
                worst = blocked
                size = os.fstat(dumps.fileno()).st_size
                if size > dumped:
                    longest = _thread_in_dump(os.pread(dumps.fileno(), min(size - dumped, 1 << 20), dumped)
                                              .decode(errors="replace"), loop_thread)

    task = asyncio.get_running_loop().create_task(beat())
    try:
        yield
    finally:
        stop = True
        await task
        faulthandler.cancel_dump_traceback_later()
        dumps.close()
    where = f"\nthe loop's thread {DUMP_AFTER_S} s into its longest block:\n{longest}" if longest else ""
    assert worst < 1.0, (f"the event loop was blocked for {worst:.2f}s (its longest wait for a CPU or the "
                         f"hypervisor, not counted: {starved:.2f}s){where}")


@pytest.fixture(scope="session")
def docker_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Docker daemon's address for the session: the one that answers, else dockerd started here and stopped at
    the end (the test command installs docker.io; a machine without it fails these tests, by name)."""
    from bunshin.envs.images.docker_daemon import daemon_running
    from bunshin.envs.images.docker_roots import DEFAULT_SOCKET

    with daemon_running(tmp_path_factory.mktemp("dockerd") / "dockerd.log"):
        yield DEFAULT_SOCKET


@pytest.fixture(scope="session")
def base_docker_ref(docker_daemon: str) -> str:
    """The declared image ``base`` (built by the setup) imported into Docker: ``docker:bunshin/base:<digest>``."""
    from bunshin.envs.images.docker_daemon import import_declared
    from bunshin.envs.images.recipes import recipe
    from bunshin.envs.images.store import ImageStore

    built = ImageStore().require(recipe("base"))
    with concurrent.futures.ThreadPoolExecutor(1) as thread:  # an async fixture may ask for it, inside a loop
        return str(thread.submit(lambda: asyncio.run(import_declared(built, address=docker_daemon))).result())

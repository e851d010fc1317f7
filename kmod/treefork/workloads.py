#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""The tree fork's workloads, run inside the VM (``kmod/vmtest`` calls this once per workload, through the host's
userland at /host): each workload is started as a container of its own (pid, mount, UTS and IPC namespaces, a root
of read-only binds of the host's /usr and /etc with a private /tmp and /dev/shm, a cgroup v2 group), frozen, read,
forked through the module, compared with its clone by the oracle while both are frozen, then both run on and must
diverge independently and keep working.

    workloads.py threads --builder BIN --threads-bin BIN [--generations 64]

Owns: making a workload's root and cgroup, starting it, the fork-compare-run cycle and its checks, and cleaning up
(every mount, cgroup and process it made, on every path). Prints TAP diagnostics ("# ...") and exits 0 if every
check held.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bunshin.envs.runtime import syscalls as sys_
from bunshin.envs.runtime.layers import LayerStore
from bunshin.envs.runtime.treefork.fork import TreeForkBuild
from bunshin.envs.runtime.treefork.oracle import compare, describe, diverge, memory_difference, pagemap_frame
from bunshin.envs.runtime.treefork.reader import read_tree
from bunshin.envs.runtime.treefork.sockets import in_network_namespace

CGROUP = Path("/sys/fs/cgroup")
WORK = Path("/tmp/treefork")


def say(msg: str) -> None:
    print(f"# {msg}", flush=True)


@dataclass
class Container:
    """A workload's root, cgroup and process tree (its pid 1 is ``init``)."""

    name: str
    root: Path
    cgroup: Path
    init: int = 0
    build: TreeForkBuild | None = None  # for a clone: the builder, its init's parent
    launcher: subprocess.Popen[bytes] | None = None
    mounts: list[Path] = field(default_factory=list)
    image: Path | None = None  # the root file system whose /usr and /etc it runs on (None: the host's)
    binds: tuple[Path, ...] = ()  # directories of the guest it sees read-only at their path (the project's)
    steps_ms: dict[str, float] = field(default_factory=dict)  # for a clone: how long each step of its fork took

    def freeze(self, frozen: bool) -> None:
        (self.cgroup / "cgroup.freeze").write_text("1" if frozen else "0")
        deadline = time.monotonic() + 30
        want = f"frozen {int(frozen)}"
        while want not in (self.cgroup / "cgroup.events").read_text().splitlines():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.cgroup} did not reach '{want}'")
            time.sleep(0.01)

    def path(self, inside: str) -> Path:
        return self.root / inside.lstrip("/")


_pool: LayerStore | None = None


@contextlib.contextmanager
def layer_pool() -> Iterator[LayerStore]:
    """The containers' writable layers, btrfs subvolumes in a pool on a loop device (as the engine's are): a clone's
    /tmp is a snapshot of its source's, made in constant time, whose files keep their inode numbers (SQLite, for
    one, refuses to write a database whose path now names another inode). Made and removed around a run."""
    global _pool
    (WORK / "pool").mkdir(parents=True, exist_ok=True)
    _pool = LayerStore.create_pool(WORK / "pool", size_bytes=8 << 30)
    try:
        yield _pool
    finally:
        _pool.destroy_pool()
        _pool = None
        shutil.rmtree(WORK / "pool", ignore_errors=True)


def make_root(base: Path, snapshot_of: str | None, image: Path | None = None,
              binds: tuple[Path, ...] = ()) -> tuple[Path, list[Path]]:
    """A container root: read-only binds of /usr and /etc (the host's, or those of the workspace image ``image``)
    and of ``binds`` at their path, /dev, /dev/shm and /dev/pts of its own, and a /tmp of its own: a new layer of the pool, or, for a
    clone, a snapshot of the container ``snapshot_of``'s (the root's other entries of that container copied)."""
    assert _pool is not None, "make_root runs inside layer_pool()"
    root = base / "root"
    root.mkdir(parents=True)
    mounts = []
    sys_.mount("root", str(root), "tmpfs", 0, "mode=0755")
    mounts.append(root)
    for link in ("bin", "sbin", "lib", "lib64"):
        os.symlink(f"usr/{link}", root / link)
    for d, ro in (("usr", True), ("etc", True), ("dev", False)):
        (root / d).mkdir()
        sys_.mount(f"{image or ''}/{d}", str(root / d), None, sys_.MS_BIND)
        if ro:
            sys_.mount(None, str(root / d), None, sys_.MS_REMOUNT | sys_.MS_BIND | sys_.MS_RDONLY)
        mounts.append(root / d)
    for d in ("proc", "tmp", "run", "sys"):
        (root / d).mkdir()
    if snapshot_of is None:
        layer = _pool.create(base.name)
        (layer / "upper").chmod(0o1777)
    else:
        layer = _pool.snapshot(snapshot_of, base.name)
    sys_.mount(str(layer / "upper"), str(root / "tmp"), None, sys_.MS_BIND)
    mounts.append(root / "tmp")
    (root / "dev" / "shm").mkdir(exist_ok=True)
    sys_.mount("shm", str(root / "dev" / "shm"), "tmpfs")
    mounts.append(root / "dev" / "shm")
    # terminals: a devpts instance of its own (its ptys are not the guest's; /dev/ptmx opens the one beside it)
    (root / "dev" / "pts").mkdir(exist_ok=True)
    sys_.mount("devpts", str(root / "dev" / "pts"), "devpts", sys_.MS_NOSUID | sys_.MS_NOEXEC,
               "newinstance,ptmxmode=0666,mode=0620")
    mounts.append(root / "dev" / "pts")
    if snapshot_of is not None:
        def sockets(d: str, names: list[str]) -> list[str]:  # and the binds' mount points
            return [n for n in names if stat.S_ISSOCK(os.lstat(f"{d}/{n}").st_mode) or os.path.ismount(f"{d}/{n}")]

        # the source root's own files besides /tmp (socket files are made again by the builder, bound anew)
        for entry in (WORK / snapshot_of / "root").iterdir():
            if entry.name in ("usr", "etc", "dev", "proc", "sys", "tmp", "bin", "sbin", "lib", "lib64") or \
                    os.path.ismount(entry):
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.copytree(entry, root / entry.name, symlinks=True, dirs_exist_ok=True, ignore=sockets)
            elif not (root / entry.name).exists():
                shutil.copy2(entry, root / entry.name, follow_symlinks=False)
    for bind in binds:  # last: a bind below /tmp (the project in CI's checkout) is on the root's own /tmp
        inside = root / bind.relative_to("/")
        inside.mkdir(parents=True, exist_ok=True)
        sys_.mount(str(bind), str(inside), None, sys_.MS_BIND)
        sys_.mount(None, str(inside), None, sys_.MS_REMOUNT | sys_.MS_BIND | sys_.MS_RDONLY)
        mounts.append(inside)
    return root, mounts


CHROMIUM_START_S = 600  # the source's Chromium loads its page within this (as Calc's sheet within 600 s)


def start(name: str, argv: list[str], files: tuple[str, ...] = (), image: Path | None = None,
          network: bool = False, output: str = "/dev/null", binds: tuple[Path, ...] = (),
          pass_fds: tuple[int, ...] = ()) -> Container:
    """Start ``argv`` as pid 1 of a new container (on ``image``'s /usr and /etc, else the host's); ``files`` are
    copied into its /tmp first. With ``network``, in a network namespace of its own (its loopback up), else in the
    guest's (a tree fork's clones get their own from the builder). Its stdout and stderr go to ``output`` (a path
    inside it); it sees ``binds`` read-only, and has our descriptors ``pass_fds`` at their numbers."""
    base = WORK / name
    root, mounts = make_root(base, None, image, binds)
    for f in files:
        shutil.copy(f, root / "tmp")
    cgroup = CGROUP / f"treefork-{name}"
    cgroup.mkdir()
    command = ["unshare", "--pid", "--fork", "--mount", "--uts", "--ipc", f"--root={root}", "--wd=/tmp", "/bin/sh",
               "-c", f'mount -t proc proc /proc && hostname {name} && exec "$@" </dev/null >{shlex.quote(output)} 2>&1', name,
               *argv]
    if network:  # made with the guest's tools, before the root changes
        command = ["unshare", "--net", "/bin/sh", "-c", 'ip link set lo up && exec "$@"', "network", *command]
    script = f"echo $$ > {cgroup}/cgroup.procs && exec {shlex.join(command)}"
    return launch(Container(name, root, cgroup, mounts=mounts, image=image, binds=binds), script, pass_fds=pass_fds)


def launch(box: Container, script: str, deadline_s: float = 60.0, pass_fds: tuple[int, ...] = ()) -> Container:
    """Run the shell ``script`` that starts ``box``'s pid 1 (in a pid namespace of its own); returns ``box`` once
    that process is there. Its output goes to launcher.log in the container's directory."""
    log_path = WORK / box.name / "launcher.log"
    log = open(log_path, "wb")  # noqa: SIM115 (the launcher writes it while it runs)
    box.launcher = subprocess.Popen(["/bin/sh", "-c", script], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    close_fds=True, start_new_session=True, pass_fds=pass_fds)
    log.close()
    deadline = time.monotonic() + deadline_s
    while not box.init:
        if time.monotonic() > deadline or box.launcher.poll() is not None:
            raise RuntimeError(f"{box.name} did not start: {log_path.read_text()[-3000:]}")
        box.init = _init_of(box.launcher.pid)
        time.sleep(0.02)
    return box


def _init_of(launcher: int) -> int:
    """The launcher's child that is pid 1 of a pid namespace of its own (0: none yet; the launcher may run a tool
    first, ``ip`` say)."""
    for kid in Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split():
        with contextlib.suppress(OSError):
            if len(Path(f"/proc/{kid}/status").read_text().split("NSpid:")[1].split("\n")[0].split()) > 1:
                return int(kid)
    return 0


def until_started(box: Container, ready: Callable[[Container], bool], what: str, deadline_s: float = 120.0) -> None:
    """Wait until ``ready(box)`` says ``box``'s program has started (``what``). A fixed sleep is not enough: under TCG
    beside other jobs a start can take seconds, and a tree forked mid-start is refused (its pid 1 still the
    launcher's shell, say, with the launcher's log open). A start that never comes raises, with the log."""
    deadline = time.monotonic() + deadline_s
    while not ready(box):
        if time.monotonic() > deadline or box.launcher is None or box.launcher.poll() is not None:
            log = (WORK / box.name / "launcher.log").read_text()[-2000:]
            raise RuntimeError(f"{box.name}: {what} did not happen within {deadline_s:.0f} s: {log}")
        time.sleep(0.05)


def threads_running(box: Container) -> bool:
    """Whether the threads program in ``box`` has written its first report (it has exec'd and its threads run)."""
    with contextlib.suppress(OSError, ValueError):
        return "ticks" in threads_report(box)
    return False


def fork(source: Container, name: str, builder: str, made: list[Container], fault: str = "",
         fault_pid: int = 1, inherit: dict[tuple[int, int], int] | None = None) -> tuple[Container, float]:
    """A tree fork of the frozen ``source``: returns the clone, frozen before its first instruction, and the
    milliseconds from the builder's start to every clone grafted. The clone's container is in ``made`` from the
    start (its root and cgroup are cleaned up with the others whatever happens). ``inherit``: descriptors of the
    source, (pid, number), that the clone gets from us instead (our descriptor numbers)."""
    base = WORK / name
    started = time.monotonic()
    root, mounts = make_root(base, source.name, source.image, source.binds)
    cgroup = CGROUP / f"treefork-{name}"
    cgroup.mkdir()
    clone = Container(name, root, cgroup, mounts=mounts, image=source.image, binds=source.binds)
    made.append(clone)
    engine_step("root")
    snapshot = time.monotonic()
    plan = read_tree(source.init, hostname=source.name, inherit=inherit)
    plan.root, plan.cgroup = str(root), str(cgroup)
    for below in plan.cgroups:  # the source's cgroups below its own, the clone's below its own
        (cgroup / below).mkdir(parents=True, exist_ok=True)
    engine_step("read")
    read = time.monotonic()
    clone.build = TreeForkBuild(plan, builder, fault=fault, fault_pid=fault_pid,
                                pass_fds=tuple(sorted(set((inherit or {}).values()))))
    # frozen before it runs: the held clones trap into the freezer as they are released
    (cgroup / "cgroup.freeze").write_text("1")
    clone.build.release()
    clone.freeze(True)
    clone.init = clone.build.init_pid
    clone.steps_ms = {"snapshot": (snapshot - started) * 1000, "read": (read - snapshot) * 1000,
                      "build": (time.monotonic() - read) * 1000}
    return clone, clone.build.grafted_ms


ENGINE_STEPS = ("frozen", "root", "read")  # the engine's own steps, before the builder's (the faults workload)
_engine_dies_at = ""


def engine_step(at: str) -> None:
    """The faults workload's engine dies here (SIGKILL, as the OOM killer would end it) when told to."""
    if at == _engine_dies_at:
        os.kill(os.getpid(), signal.SIGKILL)


# a refusal of a state the source leaves by itself (Chromium's processes pass descriptors over their sockets: a
# freeze can catch one in flight): the source runs a moment and the fork is tried again, the time counted
# or a source process gone between the read and the build (SIGKILL ends even a frozen task: seen once in 14 forks of
# Chromium)
TRANSIENT = re.compile(r"in flight|queued|pending connections|closed by its peer|"
                       r"/proc/\d+\S* ?: No such file or directory")
ATTEMPTS = 5


def fork_when_quiet(source: Container, name: str, builder: str, made: list[Container],
                    thaw: bool = True) -> tuple[Container, float, int]:
    """A tree fork of the running ``source``: the clone, how long the source was frozen for it (every attempt's
    freeze summed; without ``thaw`` it stays frozen, as forked, and the last attempt's freeze is counted to the
    fork's end) and how many attempts were refused for a transient state first."""
    from bunshin.envs.runtime.treefork.errors import TreeForkFailed, TreeForkRefused

    frozen = 0.0
    for attempt in range(ATTEMPTS):
        started = time.monotonic()
        source.freeze(True)
        try:
            clone, _ = fork(source, name, builder, made)
        except (TreeForkFailed, TreeForkRefused) as e:
            source.freeze(False)
            frozen += (time.monotonic() - started) * 1000
            if attempt == ATTEMPTS - 1 or not TRANSIENT.search(str(e)):
                raise
            say(f"{name}: refused for now ({str(e).splitlines()[0][:120]}); the source runs a moment")
            for box in [b for b in made if b.name == name]:
                end(box)
                made.remove(box)
            time.sleep(0.2)
            continue
        except BaseException:
            source.freeze(False)
            raise
        if thaw:
            source.freeze(False)
        return clone, frozen + (time.monotonic() - started) * 1000, attempt
    raise AssertionError("unreachable")


def end(box: Container) -> None:
    """Kill the container's processes and remove its cgroup and mounts."""
    with contextlib.suppress(OSError):
        (box.cgroup / "cgroup.kill").write_text("1")
    if box.build is not None:
        box.build.kill()
    if box.launcher is not None:
        with contextlib.suppress(OSError):
            os.killpg(box.launcher.pid, signal.SIGKILL)
        box.launcher.wait()
    deadline = time.monotonic() + 10
    while box.cgroup.exists():
        try:  # the cgroups below it first
            for below in sorted(box.cgroup.rglob("*/"), key=lambda d: -len(d.parts)):
                if below.is_dir() and (below / "cgroup.procs").exists():
                    below.rmdir()
            box.cgroup.rmdir()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    for mount in reversed(box.mounts):
        sys_.umount(str(mount), sys_.MNT_DETACH)
    if _pool is not None:
        _pool.delete(box.name)
    shutil.rmtree(WORK / box.name, ignore_errors=True)


@contextlib.contextmanager
def containers() -> Iterator[list[Container]]:
    made: list[Container] = []
    try:
        yield made
    finally:
        for box in reversed(made):
            end(box)


def oracle(source: Container, clone: Container, pages_per_mapping: int = 4,
           inherited: frozenset[tuple[int, int]] = frozenset()) -> list[str]:
    """The oracle's differences (but in the ``inherited`` descriptors, the clone's from us) and the divergence's
    failures (``pages_per_mapping`` private pages written into each mapping of each side)."""
    started = time.monotonic()
    # both sides at once: reading and hashing their memory is most of it, and the guest has two CPUs
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        sides = list(pool.map(describe, (source.init, clone.init)))
    problems = compare(*sides, inherited)
    hosts = [{_ns_pid(p): p for p in _tree(box.init)} for box in (source, clone)]
    for n, problem in enumerate(problems):  # what a memory difference is, to say why
        words = problem.split()
        if len(words) > 3 and words[2] == "memory" and int(words[1]) in hosts[0] and int(words[1]) in hosts[1]:
            problems[n] += ": " + memory_difference(hosts[0][int(words[1])], hosts[1][int(words[1])],
                                            words[3].rstrip(":"))
    failures, tried, shared = diverge(source.init, clone.init, pages_per_mapping)
    say(f"oracle: {len(problems)} differences; divergence: {tried} private pages written on each side, "
        f"{shared} of them shared before the write, {len(failures)} seen across ({time.monotonic() - started:.1f} s)")
    return problems + failures


def threads_report(box: Container) -> dict[str, int]:
    words = box.path("/tmp/threads.out").read_text().split()
    return dict(zip(words[0::2], map(int, words[1::2]), strict=False))


def check_threads_run(boxes: list[Container]) -> list[str]:
    """Each container's threads keep working on their own: ticks and bytes advance, nothing bad."""
    before = [threads_report(b) for b in boxes]
    time.sleep(2)
    after = [threads_report(b) for b in boxes]
    out = []
    for box, b, a in zip(boxes, before, after, strict=True):
        say(f"{box.name}: {b} -> {a}")
        if a["ticks"] <= b["ticks"] or a["bytes"] <= b["bytes"]:
            out.append(f"{box.name}: its threads did not run on ({b} -> {a})")
        if a["bad"]:
            out.append(f"{box.name}: a thread found its state or the byte stream broken ({a})")
    return out


def workload_threads(args: argparse.Namespace) -> list[str]:
    problems: list[str] = []
    with containers() as made:
        source = start("threads", ["/tmp/treefork-threads", "2", "/tmp/threads.out"], files=(args.threads_bin,))
        made.append(source)
        until_started(source, threads_running, "its first report")
        chain = [source]
        for generation in range(1, args.generations + 1):
            parent = chain[-1]
            parent.freeze(True)
            started = time.monotonic()
            clone, ms = fork(parent, f"threads-{generation}", args.builder, made)
            forked = time.monotonic() - started
            chain.append(clone)
            found = oracle(parent, clone)
            problems += [f"generation {generation}: {p}" for p in found]
            say(f"generation {generation}: grafted in {ms:.1f} ms (the fork with its root and cgroup: {forked:.2f} s)")
            parent.freeze(False)
            clone.freeze(False)
            if found:
                break
            if parent is not source:  # the chain goes on from the clone; its parent has done its part
                end(parent)
                made.remove(parent)
            time.sleep(0.2)
        problems += check_threads_run([source, chain[-1]])
    problems += fan_out(args)
    return problems


def _smaps_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def fan_out(args: argparse.Namespace, n: int = 4, heap_mib: int = 32) -> list[str]:
    """N clones of one source with a heap of ``heap_mib`` MiB, run a second: each clone's memory of its own
    (Private_Dirty) is what it wrote since, not a copy of the heap; every sampled page of the heap (which nobody
    writes after the start) shares its frame with the source's."""
    problems = []
    with containers() as made:
        source = start("fan", ["/tmp/treefork-threads", str(heap_mib), "/tmp/threads.out"], files=(args.threads_bin,))
        made.append(source)
        until_started(source, threads_running, "its first report")
        source.freeze(True)
        clones = []
        for k in range(n):
            clone, _ = fork(source, f"fan-{k}", args.builder, made)
            clones.append(clone)
        for box in [source, *clones]:  # they run a while: what they write is theirs
            box.freeze(False)
        time.sleep(1)
        start_addr = threads_report(source)["heap"]
        pages = range(0, heap_mib * 256, 64)
        shared = sum(pagemap_frame(source.init, start_addr + i * 4096) == pagemap_frame(c.init, start_addr + i * 4096) != -1
                     for c in clones for i in pages)
        tried = len(clones) * len(pages)
        own = [_smaps_kb(c.init, "Private_Dirty") for c in clones]
        source_rss = _smaps_kb(source.init, "Rss")
        say(f"fan-out: {n} clones of a {heap_mib} MiB heap: {shared}/{tried} sampled heap pages share the source's "
            f"frame; each clone's Private_Dirty {own} kB (the source's Rss {source_rss} kB)")
        if shared != tried:
            problems.append(f"fan-out: {tried - shared} of {tried} sampled heap pages do not share the source's frame")
        if max(own) > heap_mib * 1024 // 4:
            problems.append(f"fan-out: a clone holds {max(own)} kB of its own for a {heap_mib} MiB heap")
    return problems



SHELL_SCRIPT = """
sleep 1000 &
echo $! > /tmp/job
(while true; do echo tick; sleep 0.1; done) | cat >> /tmp/ticks &
setsid sh -c '(while true; do echo tick >> /tmp/daemon; sleep 0.1; done) & exit 0' &
while [ ! -e /tmp/go ]; do sleep 0.05; done
kill $(cat /tmp/job)
wait $(cat /tmp/job)
echo "reaped $?" > /tmp/result
while true; do sleep 1; done
"""


def _daemon_adopted(box: Container) -> bool:
    """Whether a child of ``box``'s pid 1 is in a session whose leader is gone (the shell workload's daemon, once
    the ``sh`` that started its session has exited)."""
    for pid in _tree(box.init):
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ppid, sid = int(fields[1]), int(fields[3])
            if ppid == box.init and sid not in (pid, 0) and not Path(f"/proc/{sid}").exists():
                return True
    return False


def shell_started(box: Container) -> bool:
    """Whether SHELL_SCRIPT in ``box`` has started its job and its daemon (the daemon's session leader gone)."""
    return box.path("/tmp/job").exists() and box.path("/tmp/daemon").exists() and _daemon_adopted(box)


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def workload_shell(args: argparse.Namespace) -> list[str]:
    """A shell (pid 1) with a background job, a background pipeline and a daemon (a double fork: its session's
    leader is gone, the builder makes the session with a placeholder): in the clone, ``wait`` reaps the clone's own
    job, the pipeline and the daemon run on into the clone's files, and the source's job lives on."""
    problems: list[str] = []
    with containers() as made:
        source = start("shell", ["/bin/sh", "-c", SHELL_SCRIPT])
        made.append(source)
        until_started(source, shell_started, "its job and its daemon")
        job = int(source.path("/tmp/job").read_text())
        job_host = next(p for p in _tree(source.init) if _ns_pid(p) == job)
        (source.cgroup / "jobs").mkdir()  # the background job in a cgroup below the shell's, as an agent's is
        (source.cgroup / "jobs" / "cgroup.procs").write_text(str(job_host))
        source.freeze(True)
        clone, ms = fork(source, "shell-1", args.builder, made)
        clone_job = [p for p in _tree(clone.init) if _ns_pid(p) == job]
        where = Path(f"/proc/{clone_job[0]}/cgroup").read_text().strip() if clone_job else "(no job)"
        say(f"the clone's job (pid {job}) is in {where}")
        if not where.endswith(f"/{clone.cgroup.name}/jobs"):
            problems.append(f"the clone's job is not in its cgroup 'jobs' below the clone's: {where}")
        say(f"grafted in {ms:.1f} ms, {len(clone.build.plan.processes) if clone.build else 0} processes")
        problems += oracle(source, clone)
        source.freeze(False)
        clone.freeze(False)
        ticks = [lines(source.path("/tmp/ticks")), lines(clone.path("/tmp/ticks"))]
        daemon = [lines(source.path("/tmp/daemon")), lines(clone.path("/tmp/daemon"))]
        clone.path("/tmp/go").write_text("")
        deadline = time.monotonic() + 30
        while not clone.path("/tmp/result").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        result = clone.path("/tmp/result").read_text().strip() if clone.path("/tmp/result").exists() else ""
        say(f"clone: {result!r}; ticks source {ticks[0]} -> {lines(source.path('/tmp/ticks'))}, "
            f"clone {ticks[1]} -> {lines(clone.path('/tmp/ticks'))}")
        if result != "reaped 143":
            problems.append(f"the clone's shell did not reap its own job after killing it: {result!r}")
        if source.path("/tmp/result").exists():
            problems.append("the source's shell saw the clone's /tmp/go")
        job = source.path("/tmp/job").read_text().strip()
        alive = any(_ns_pid(int(p)) == int(job) for p in _tree(source.init))
        if not alive:
            problems.append(f"the source's job (pid {job} in its namespace) is gone")
        def advanced() -> bool:  # every writer has written again, on both sides (slow under TCG beside other jobs)
            return (lines(source.path("/tmp/ticks")) > ticks[0] and lines(clone.path("/tmp/ticks")) > ticks[1]
                    and lines(source.path("/tmp/daemon")) > daemon[0] and lines(clone.path("/tmp/daemon")) > daemon[1])

        deadline = time.monotonic() + 30
        while not advanced() and time.monotonic() < deadline:
            time.sleep(0.2)
        if lines(source.path("/tmp/ticks")) <= ticks[0] or lines(clone.path("/tmp/ticks")) <= ticks[1]:
            problems.append("a background pipeline stopped")
        if lines(source.path("/tmp/daemon")) <= daemon[0] or lines(clone.path("/tmp/daemon")) <= daemon[1]:
            problems.append(f"a daemon stopped (lines source {daemon[0]}, clone {daemon[1]} before)")
        if clone.build and not any(p.placeholder for p in clone.build.plan.processes):
            problems.append("the daemon's session was not made by a placeholder (is its leader still there?)")
    return problems


def type_keys(box: Container, keys: bytes) -> None:
    """Type ``keys`` into the terminal of ``box`` (``pty_app.py``: it reads /tmp/keys, whole, by rename), once it
    has taken the keys typed before."""
    deadline = time.monotonic() + 10
    while box.path("/tmp/keys").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    box.path("/tmp/keys.new").write_bytes(keys)
    box.path("/tmp/keys.new").rename(box.path("/tmp/keys"))


def screen(box: Container) -> bytes:
    """Everything the terminal of ``box`` has shown."""
    return box.path("/tmp/screen").read_bytes() if box.path("/tmp/screen").exists() else b""


def shows(box: Container, since: int, text: bytes, times: int = 1, timeout: float = 30.0) -> bool:
    """Whether the terminal of ``box`` shows ``text`` (``times`` times) after its first ``since`` bytes, within
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while screen(box)[since:].count(text) < times:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def running(box: Container, comm: str) -> list[int]:
    return [p for p in _tree(box.init) if _comm(p) == comm and _state(p) != "Z"]


def workload_pty(args: argparse.Namespace) -> list[str]:
    """A terminal (``pty_app.py``): pid 1 holds a pty's master, an interactive bash with job control runs on its
    slave (the leader of a session the pty is the controlling terminal of), a job in the background (``sleep``)
    and one in the foreground (``cat``: its process group the terminal's foreground group) when it is forked. The
    clone's pty has the same index, termios and window size and nothing in flight (the oracle); what is typed into
    the clone reaches the clone's cat only; Ctrl-C ends the clone's cat only (SIGINT goes to the clone terminal's
    foreground group); the clone's bash then answers on /dev/pts/0 with its job still there; the source's terminal
    is untouched and works on alike; once the clone's bash and its job are gone, the clone's terminal sees its pty
    hang up and exits (nothing else, the builder neither, holds the slave)."""
    problems: list[str] = []
    with containers() as made:
        source = start("pty", ["/usr/bin/python3", "/tmp/pty_app.py"], files=(args.pty_app,))
        made.append(source)
        if not shows(source, 0, b"$ "):
            return [f"bash did not prompt in the source's terminal: {screen(source)[-500:]!r}"]
        type_keys(source, b"stty cols 101 rows 33; sleep 1000 &\n")
        if not shows(source, 0, b"$ ", times=2):
            return [f"bash did not start its background job: {screen(source)[-500:]!r}"]
        type_keys(source, b"cat\n")
        deadline = time.monotonic() + 30
        while not running(source, "cat") and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # cat waits in read() on the terminal
        clone, frozen_ms, attempts = fork_when_quiet(source, "pty-1", args.builder, made, thaw=False)
        plan = clone.build.plan if clone.build else None
        terminals = [f for f in plan.files if f.kind in ("ptmx", "pts")] if plan else []
        ctty = [p.pid for p in plan.processes if p.ctty >= 0] if plan else []
        foreground = [p.pid for p in plan.processes if p.foreground >= 0] if plan else []
        say(f"forked in {frozen_ms:.0f} ms ({attempts} refused first): {[(f.kind, f.path) for f in terminals]}, "
            f"controlling terminal of pid {ctty}, foreground group of pid {foreground}")
        if sorted(f.kind for f in terminals) != ["ptmx", "pts"] or len(ctty) != 1 or len(foreground) != 1:
            problems.append("the plan does not have the terminal, its session's leader and its foreground group")
        problems += oracle(source, clone)
        source.freeze(False)
        clone.freeze(False)
        s0, c0 = len(screen(source)), len(screen(clone))
        type_keys(clone, b"from-the-clone\n")
        if not shows(clone, c0, b"from-the-clone", times=2):  # the terminal's echo, then cat's copy
            problems.append(f"the clone's cat did not copy what was typed: {screen(clone)[c0:][-300:]!r}")
        type_keys(clone, b"\x03")
        deadline = time.monotonic() + 15
        while running(clone, "cat") and time.monotonic() < deadline:
            time.sleep(0.05)
        if running(clone, "cat"):
            problems.append("Ctrl-C did not end the clone's cat (its terminal's foreground group is not cat's)")
        if not running(source, "cat"):
            problems.append("the source's cat ended with the clone's")
        type_keys(clone, b"tty; jobs; echo clone-$((6*7))\n")
        if not shows(clone, c0, b"clone-42"):
            problems.append(f"the clone's bash did not answer: {screen(clone)[c0:][-300:]!r}")
        said = screen(clone)[c0:]
        say(f"the clone's terminal: {said[-160:]!r}")
        if b"/dev/pts/0" not in said or b"sleep 1000" not in said:
            problems.append(f"the clone's bash is not on /dev/pts/0 or lost its job: {said[-300:]!r}")
        if b"from-the-clone" in screen(source)[s0:]:
            problems.append("what was typed into the clone shows in the source's terminal")
        type_keys(source, b"from-the-source\n")
        if not shows(source, s0, b"from-the-source", times=2):
            problems.append(f"the source's cat did not copy what was typed: {screen(source)[s0:][-300:]!r}")
        type_keys(source, b"\x03")
        type_keys_after(source, b"echo source-$((6*7))\n", lambda: not running(source, "cat"))
        if not shows(source, s0, b"source-42"):
            problems.append(f"the source's bash did not answer: {screen(source)[s0:][-300:]!r}")
        if b"from-the-source" in screen(clone)[c0:]:
            problems.append("what was typed into the source shows in the clone's terminal")
        # the clone's bash and its job gone, the terminal reads EOF (EIO) and exits: nothing else holds the pty
        type_keys(clone, b"kill %1; exit\n")
        deadline = time.monotonic() + 20
        while _state(clone.init) not in ("Z", "") and time.monotonic() < deadline:
            time.sleep(0.05)
        if _state(clone.init) not in ("Z", ""):
            problems.append("the clone's terminal did not see its pty hang up after its bash exited (something "
                            "else holds the pty's slave)")
        if not running(source, "bash"):
            problems.append("the source's bash exited with the clone's")
    return problems


def type_keys_after(box: Container, keys: bytes, ready: Callable[[], bool], timeout: float = 15.0) -> None:
    """Type ``keys`` once ``ready()`` holds (or ``timeout`` seconds passed: the check after it says what failed)."""
    deadline = time.monotonic() + timeout
    while not ready() and time.monotonic() < deadline:
        time.sleep(0.05)
    type_keys(box, keys)


SHOP_PORT = 7770


def http(box: Container, path: str, cookie: str = "", form: dict[str, str] | None = None,
         timeout: float = 120.0) -> tuple[int, str]:
    """The status and body of a GET (a POST with ``form``) of ``path`` on the shop in ``box``, over its loopback."""
    import http.client
    import urllib.parse

    def ask() -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", SHOP_PORT, timeout=timeout)
        try:
            headers = {"Cookie": f"session={cookie}"} if cookie else {}
            if form is None:
                conn.request("GET", path, headers=headers)
            else:
                headers["Content-Type"] = "application/x-www-form-urlencoded"
                conn.request("POST", path, urllib.parse.urlencode(form), headers)
            reply = conn.getresponse()
            return reply.status, reply.read().decode(errors="replace")
        finally:
            conn.close()

    return in_network_namespace(box.init, ask, timeout + 10)


def workload_webshop(args: argparse.Namespace) -> list[str]:
    """The embedded web shop's HTTP server (``shop_app.py``: its catalog, search index and images in memory, carts
    and orders in SQLite) as a plain process in its own network namespace: the clone serves the source's pages
    byte for byte on its own loopback, and a cart filled on one side is that side's only."""
    problems: list[str] = []
    # the project and the interpreter its virtualenv runs on (the host's /usr is there already)
    binds = tuple(sorted({Path(__file__).resolve().parent.parent.parent, Path(sys.base_prefix)} - {Path("/usr")}))
    with containers() as made:
        source = start("webshop", [sys.executable, "/tmp/shop_app.py", "2000"], files=(args.shop_app,),
                       network=True, output="/tmp/shop.log", binds=binds)
        made.append(source)
        deadline = time.monotonic() + 300
        while not source.path("/tmp/ready").exists():
            if time.monotonic() > deadline or _state(source.init) in ("", "Z"):
                return [f"the shop did not start in 300 s: {source.path('/tmp/shop.log').read_text()[-2000:]}"]
            time.sleep(0.5)
        home = http(source, "/")[1]
        category = re.findall(r'href="(/[a-z0-9-]+/[a-z0-9-]+\.html)"', home)
        found = http(source, "/catalogsearch/result/?q=headphones")[1]
        skus = list(dict.fromkeys(re.findall(r"-(b\d{10})\.html", found)))
        if not category or len(skus) < 2:
            return [f"the shop's pages have no category ({category[:2]}) or fewer than two products ({skus})"]
        product = re.findall(r'href="(/[a-z0-9-]*-b\d{10}\.html)"', found)
        paths = ["/", "/catalogsearch/result/?q=headphones", category[0], *product[:1]]
        before = {p: http(source, p) for p in paths}
        clone, frozen_ms, refused = fork_when_quiet(source, "webshop-1", args.builder, made, thaw=False)
        plan = clone.build.plan if clone.build else None
        say(f"grafted in {clone.build.grafted_ms if clone.build else 0:.1f} ms, "
            f"{len(plan.processes) if plan else 0} processes, {len(plan.files) if plan else 0} open files "
            f"({refused} attempts refused first)")
        problems += oracle(source, clone)
        source.freeze(False)
        clone.freeze(False)
        try:
            problems += shop_diverges(source, clone, paths, before, skus)
        except OSError as e:
            problems.append(f"{type(e).__name__}: {e}; the clone's log ends: "
                            f"{clone.path('/tmp/shop.log').read_text(errors='replace')[-2000:]}")
    return problems


def shop_diverges(source: Container, clone: Container, paths: list[str], before: dict[str, tuple[int, str]],
                  skus: list[str]) -> list[str]:
    """The clone serves ``before`` at ``paths``; a cart filled on one side is that side's only."""
    problems = []
    after = {p: http(clone, p) for p in paths}
    differ = [p for p in paths if after[p] != before[p]]
    say(f"the clone served {len(paths) - len(differ)} of {len(paths)} pages as the source did "
        f"({sum(len(b) for _, b in after.values())} bytes)")
    if differ:
        problems.append(f"the clone's pages differ from the source's at {differ}")
    status, _ = http(clone, "/checkout/cart/add", "treefork", {"sku": skus[0], "qty": "2"})
    http(source, "/checkout/cart/add", "treefork", {"sku": skus[1], "qty": "1"})
    carts = [http(box, "/checkout/cart/", "treefork")[1] for box in (source, clone)]
    say(f"cart add in the clone: HTTP {status}; the source's cart holds {[s for s in skus[:2] if s in carts[0]]}, "
        f"the clone's {[s for s in skus[:2] if s in carts[1]]}")
    if skus[0] not in carts[1] or skus[1] in carts[1] or skus[0] in carts[0] or skus[1] not in carts[0]:
        problems.append("a cart filled on one side is not that side's only")
    return problems


# pid 1 of the channel workload: answers each message on the descriptor argv[1] names (its engine's channel)
CHANNEL_APP = """
import socket, sys
c = socket.socket(fileno=int(sys.argv[1]))
while True:
    m = c.recv(64)
    if not m:
        break
    c.sendall(b"echo " + m)
"""


def ask(channel: socket.socket, message: bytes) -> bytes:
    channel.settimeout(60)
    channel.sendall(message)
    return channel.recv(64)


def workload_channel(args: argparse.Namespace) -> list[str]:
    """A process holding a socket to us, its engine (outside the tree: alone it would refuse the fork), forked with
    that descriptor inherited (``read_tree``'s ``inherit``, CRIU's ``--inherit-fd``): the clone answers on the
    new channel we gave it, the source on its own, neither hears the other's messages."""
    problems: list[str] = []
    ours, theirs = socket.socketpair()
    with containers() as made, ours:
        source = start("channel", ["/usr/bin/python3", "-c", CHANNEL_APP, str(theirs.fileno())],
                       pass_fds=(theirs.fileno(),))
        made.append(source)
        theirs.close()
        if ask(ours, b"one") != b"echo one":
            return ["the source does not answer on its channel"]
        number = int(next(n for n in os.listdir(f"/proc/{source.init}/fd")
                          if os.readlink(f"/proc/{source.init}/fd/{n}").startswith("socket:")))
        clone_ours, clone_theirs = socket.socketpair()
        with clone_ours, clone_theirs:
            source.freeze(True)
            clone, ms = fork(source, "channel-1", args.builder, made, inherit={(1, number): clone_theirs.fileno()})
            say(f"grafted in {ms:.1f} ms; the source's descriptor {number} (a socket to us) given the clone as our "
                f"descriptor {clone_theirs.fileno()}")
            problems += oracle(source, clone, inherited=frozenset({(1, number)}))
            source.freeze(False)
            clone.freeze(False)
            clone_theirs.close()
            answers = [ask(clone_ours, b"two"), ask(ours, b"three")]
            say(f"the clone answered {answers[0]!r} on its channel, the source {answers[1]!r} on its own")
            if answers != [b"echo two", b"echo three"]:
                problems.append(f"a channel answered out of turn: {answers}")
            ours.setblocking(False)
            clone_ours.setblocking(False)
            for channel, who in ((ours, "source"), (clone_ours, "clone")):
                with contextlib.suppress(BlockingIOError):
                    if channel.recv(64):
                        problems.append(f"the {who}'s channel had more than its answers")
    return problems


def sockets_report(box: Container) -> dict[str, int]:
    path = box.path("/tmp/sockets.out")
    words = path.read_text().split() if path.exists() else []
    return dict(zip(words[0::2], map(int, words[1::2]), strict=False))


def workload_sockets(args: argparse.Namespace) -> list[str]:
    """A Python server with a socket pair to a child (counters in flight both ways), an accepted Unix connection
    to another child, and listeners at a path, an abstract name and a TCP port: in the clone, every stream goes
    on without a byte lost or repeated, and each listener accepts a fresh connection in the clone's own namespaces;
    the source's do not see the clone's."""
    problems: list[str] = []
    with containers() as made:
        source = start("sockets", ["/usr/bin/python3", "/tmp/sockets_app.py"], files=(args.sockets_app,))
        made.append(source)
        deadline = time.monotonic() + 60
        while sockets_report(source).get("echoes", 0) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        source.freeze(True)
        clone, ms = fork(source, "sockets-1", args.builder, made)
        say(f"grafted in {ms:.1f} ms, {len(clone.build.plan.processes) if clone.build else 0} processes, "
            f"{sum(f.kind.startswith(('socket', 'unix', 'tcp', 'netlink')) for f in clone.build.plan.files) if clone.build else 0}"
            " sockets")
        problems += oracle(source, clone)
        source.freeze(False)
        clone.freeze(False)
        before = [sockets_report(source), sockets_report(clone)]
        clone.path("/tmp/go").write_text("")
        deadline = time.monotonic() + 30
        while sockets_report(clone).get("fresh", 0) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        after = [sockets_report(source), sockets_report(clone)]
        say(f"source {before[0]} -> {after[0]}; clone {before[1]} -> {after[1]}")
        for name, b, a in (("source", before[0], after[0]), ("clone", before[1], after[1])):
            if a.get("pings", 0) <= b.get("pings", 0) or a.get("echoes", 0) <= b.get("echoes", 0):
                problems.append(f"{name}: a stream stopped ({b} -> {a})")
            if a.get("bad", 1):
                problems.append(f"{name}: a counter arrived out of order ({a})")
        if after[1].get("fresh") != 3:
            problems.append(f"the clone's listeners did not all accept a fresh connection: {after[1]}")
        if not after[1].get("netlink"):
            problems.append(f"the clone's netlink socket did not answer a link dump: {after[1]}")
        if after[0].get("fresh"):
            problems.append("the source saw the clone's /tmp/go")
        alive = [_state(p) for p in _tree(clone.init)]
        if len(alive) < 3 or "Z" in alive:
            problems.append(f"a process of the clone died: {alive}")
    return problems


XDESKTOP_SCRIPT = """
Xvfb :0 -screen 0 1280x800x24 -nolisten tcp &
while [ ! -S /tmp/.X11-unix/X0 ]; do sleep 0.1; done
export DISPLAY=:0
openbox &
stdbuf -oL xev -name bunshin-xev > /tmp/xev.out &
while true; do sleep 1; done
"""


def in_container(box: Container, cmd: str) -> str:
    """``cmd`` run by sh in the container's namespaces and root, with its display."""
    try:
        done = subprocess.run(["nsenter", "-t", str(box.init), "-m", "-n", "-p", "-i", "-u", "-r", "-w", "/bin/sh",
                               "-c", f"export DISPLAY=:0; {cmd}"], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as e:
        return f"(timed out after 60 s) {e.stdout or ''}"
    return done.stdout + done.stderr


def windows(box: Container) -> str:
    return in_container(box, "xwininfo -root -tree")


def workload_xdesktop(args: argparse.Namespace) -> list[str]:
    """Xvfb with openbox and an X client (xev), on the desktop workspace image: the clone's X server answers a new
    client with the source's window tree, windows made in the clone are the clone's only, and the client in the
    clone gets the events the clone's server sends it."""
    from bunshin.envs.images.recipes import recipe
    from bunshin.envs.images.store import ImageStore

    image = ImageStore(Path(args.images) if args.images else None).require(recipe("desktop")).root
    problems: list[str] = []
    with containers() as made:
        source = start("xdesktop", ["/bin/sh", "-c", XDESKTOP_SCRIPT], image=image)
        made.append(source)
        deadline = time.monotonic() + 90
        while "bunshin-xev" not in windows(source) and time.monotonic() < deadline:
            time.sleep(0.5)
        tree = windows(source)
        if "bunshin-xev" not in tree:
            return [f"the desktop did not start: {tree[-500:]}"]
        source.freeze(True)
        clone, ms = fork(source, "xdesktop-1", args.builder, made)
        say(f"grafted in {ms:.1f} ms, {len(clone.build.plan.processes) if clone.build else 0} processes: "
            f"{[p.comm for p in clone.build.plan.processes] if clone.build else []}")
        problems += oracle(source, clone)
        source.freeze(False)
        clone.freeze(False)
        if windows(clone) != windows(source):
            problems.append("the clone's window tree is not the source's")
        seen_before = clone.path("/tmp/xev.out").read_text().count("KeyPress") if clone.path("/tmp/xev.out").exists() else 0
        say(in_container(clone, "xdotool key --window $(xdotool search --name bunshin-xev | head -1) a b c; "
                                "(xmessage -title bunshin-clone-only clone >/dev/null 2>&1 &); sleep 1")[-300:])
        deadline = time.monotonic() + 30
        while "bunshin-clone-only" not in windows(clone) and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(1)
        keys = clone.path("/tmp/xev.out").read_text().count("KeyPress") if clone.path("/tmp/xev.out").exists() else 0
        say(f"the clone's xev saw {keys - seen_before} key presses; source's xev {source.path('/tmp/xev.out').read_text().count('KeyPress')}")
        if keys <= seen_before:
            problems.append("the clone's X client got no key press from the clone's server")
        if "bunshin-clone-only" not in windows(clone) or "bunshin-clone-only" in windows(source):
            problems.append("a window made in the clone is not the clone's only")
    return problems


CALC_SCRIPT = """
Xvfb :0 -screen 0 1280x800x24 -nolisten tcp &
while [ ! -S /tmp/.X11-unix/X0 ]; do sleep 0.1; done
export DISPLAY=:0 HOME=/tmp
mkdir -p /tmp/.config/libreoffice/4/user
cp /tmp/registrymodifications.xcu /tmp/.config/libreoffice/4/user/
openbox &
soffice --calc --norestore --nologo --infilter=CSV:44,34,76,1 /tmp/sheet.csv &
while true; do sleep 1; done
"""
CALC_WINDOW = "sheet.csv - LibreOffice Calc"
# the user profile's one setting: save a CSV sheet as CSV without asking (the "Keep current format" dialog)
CALC_SETTINGS = """<?xml version="1.0" encoding="UTF-8"?>
<oor:items xmlns:oor="http://openoffice.org/2001/registry" xmlns:xs="http://www.w3.org/2001/XMLSchema"
 xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">
<item oor:path="/org.openoffice.Office.Common/Save/Document"><prop oor:name="WarnAlienFormat" oor:op="fuse">
<value>false</value></prop></item>
</oor:items>
"""


def calc_files() -> tuple[str, str]:
    """The sheet Calc opens and its profile's settings, for a container's /tmp."""
    sheet, settings = WORK / "sheet.csv", WORK / "registrymodifications.xcu"
    sheet.write_text("item,count\napples,3\npears,5\n")
    settings.write_text(CALC_SETTINGS)
    return str(sheet), str(settings)


def calc_saves(box: Container, word: str) -> str:
    """Type ``word`` into cell A1 of the box's Calc and save the sheet (keeping its CSV format); the sheet's text
    once it has ``word`` in it (else what it is after 120 s)."""
    started = time.monotonic()
    say(in_container(box, f"xdotool search --name '{CALC_WINDOW}' windowactivate --sync; sleep 1; "
                          f"xdotool key --delay 200 ctrl+Home; xdotool type --delay 100 '{word}'; "
                          "xdotool key --delay 200 Return ctrl+s")[-300:].strip() or f"{box.name}: typed '{word}', saved")
    sheet = box.path("/tmp/sheet.csv")
    deadline = time.monotonic() + 120
    while word not in sheet.read_text() and time.monotonic() < deadline:
        time.sleep(1)
    text = sheet.read_text()
    names = re.findall(r'"([^"]+)": \(', windows(box))[:12]  # xwininfo's: 0x... "name": (...)
    say(f"{box.name}: the sheet {'saved' if word in text else 'NOT saved'} {time.monotonic() - started:.0f} s after "
        f"the keys; windows: {names}")
    return text


def workload_calc(args: argparse.Namespace) -> list[str]:
    """LibreOffice Calc with a sheet open, on Xvfb with openbox (the desktop workspace image): soffice's and
    Xvfb's SysV shared memory (X's MIT-SHM) included, each side with its own copy. The clone shows the source's
    Calc window, saves the sheet after a cell is typed in its Calc, and the source's file does not change; the
    source's Calc saves its own afterwards, which the clone's file does not get."""
    from bunshin.envs.images.recipes import recipe
    from bunshin.envs.images.store import ImageStore

    image = ImageStore(Path(args.images) if args.images else None).require(recipe("desktop")).root
    problems: list[str] = []
    with containers() as made:
        source = start("calc", ["/bin/sh", "-c", CALC_SCRIPT], files=calc_files(), image=image)
        made.append(source)
        started = time.monotonic()
        while CALC_WINDOW not in windows(source) and time.monotonic() < started + 600:
            time.sleep(2)
        if CALC_WINDOW not in windows(source):
            return [f"Calc did not open the sheet in 600 s: {windows(source)[-500:]}"]
        time.sleep(5)  # the document drawn
        say(f"the source's Calc showed the sheet in {time.monotonic() - started:.0f} s")
        clone, frozen_ms, refused = fork_when_quiet(source, "calc-1", args.builder, made, thaw=False)
        plan = clone.build.plan if clone.build else None
        segments = [f for f in plan.files if f.kind == "sysv"] if plan else []
        say(f"grafted in {clone.build.grafted_ms if clone.build else 0:.1f} ms ({refused} attempts refused first), "
            f"{[p.comm for p in plan.processes] if plan else []}, {len(plan.files) if plan else 0} open files, "
            f"SysV segments {[(f.segment.size >> 10, f.segment.nattch) for f in segments if f.segment]} (KiB, "
            f"attaches)")
        if not segments:
            problems.append("no SysV segment in the plan: is MIT-SHM not in use?")
        problems += oracle(source, clone, pages_per_mapping=1)
        source.freeze(False)
        clone.freeze(False)
        if CALC_WINDOW not in windows(clone):
            problems.append(f"the clone shows no Calc window: {windows(clone)[-300:]}")
        saved = calc_saves(clone, "clonecell")
        if "clonecell" not in saved:
            problems.append(f"the clone's Calc did not save the sheet: {saved!r}")
        if "clonecell" in source.path("/tmp/sheet.csv").read_text():
            problems.append("the clone's save changed the source's sheet")
        saved = calc_saves(source, "sourcecell")
        if "sourcecell" not in saved:
            problems.append(f"the source's Calc did not save its sheet after the fork: {saved!r}")
        if "sourcecell" in clone.path("/tmp/sheet.csv").read_text():
            problems.append("the source's save changed the clone's sheet")
        say(f"sheets: source {source.path('/tmp/sheet.csv').read_text().splitlines()[:1]}, "
            f"clone {clone.path('/tmp/sheet.csv').read_text().splitlines()[:1]}")
    return problems


BUILDER_STEPS = ("plan", "namespaces", "files", "init", "grafted", "released")
HELPER_STEPS = ("children", "descriptors", "threads", "graft")
SOURCE_STEPS = ("plan", "files", "init", "grafted")


CHROMIUM_FLAGS = ["--headless=new", "--no-sandbox", "--remote-debugging-port=9222", "--user-data-dir=/tmp/profile",
                  "--no-first-run", "--disable-gpu", "--window-size=1280,800"]


def cdp(box: Container, calls: list[tuple[str, dict[str, object]]], timeout: float = 120.0) -> list[dict]:
    """The replies of the Chromium in ``box`` to DevTools calls on its page, over its debugging port in the box's
    network namespace (the calls run on an event loop in a thread that entered it)."""
    import asyncio

    import aiohttp

    async def calls_on_page() -> list[dict]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
            async with session.get("http://127.0.0.1:9222/json/list") as reply:
                page = next(t for t in await reply.json() if t["type"] == "page")
            async with session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=64 << 20) as ws:
                out = []
                for n, (method, params) in enumerate(calls, 1):
                    await ws.send_json({"id": n, "method": method, "params": params})
                    while (msg := await ws.receive_json(timeout=timeout)).get("id") != n:
                        pass
                    out.append(msg)
                return out

    return in_network_namespace(box.init, lambda: asyncio.run(calls_on_page()), timeout + 10)


def ax_names(box: Container) -> list[tuple[str, str]]:
    """The roles and names of the page's accessibility tree, as DevTools gives it."""
    [reply] = cdp(box, [("Accessibility.getFullAXTree", {})])
    return [(n.get("role", {}).get("value", ""), n.get("name", {}).get("value", ""))
            for n in reply["result"]["nodes"] if not n.get("ignored")]


def evaluate(box: Container, expression: str, timeout: float = 120.0) -> object:
    [reply] = cdp(box, [("Runtime.evaluate", {"expression": expression, "returnByValue": True})], timeout)
    return reply["result"]["result"].get("value")


def shop_page() -> Path:
    """The embedded web shop's home page, as a file Chromium opens (its links lead nowhere: no server here)."""
    from bunshin.envs.webshop import html

    page = WORK / "shop.html"
    page.write_text(html.home(["Electronics", "Home & Kitchen", "Beauty & Personal Care", "Sports & Outdoors"]))
    return page


def workload_chromium(args: argparse.Namespace) -> list[str]:
    """Headless Chromium (browser, GPU, network, storage and renderer processes, crashpad's daemons) on the web
    shop's home page, on the chromium workspace image: the clone answers DevTools on its own debugging port with the
    source's accessibility tree, and what a script changes in the clone's page is the clone's only."""
    from bunshin.envs.images.recipes import recipe
    from bunshin.envs.images.store import ImageStore

    image = ImageStore(Path(args.images) if args.images else None).require(recipe("chromium")).root
    problems: list[str] = []
    with containers() as made:
        source = start("chromium", ["/usr/bin/chromium", *CHROMIUM_FLAGS, "file:///tmp/shop.html"],
                       files=(str(shop_page()),), image=image, output="/tmp/chromium.log")
        made.append(source)
        # Chromium's start under TCG: 63 s beside two CPU-bound loops, over 180 s once more ran beside them (its
        # network service restarted meanwhile): the fork is what is measured, not how fast the emulated start is
        deadline = time.monotonic() + CHROMIUM_START_S
        title: object = None
        error: Exception | None = None
        while time.monotonic() < deadline and not title:
            try:
                title = evaluate(source, "document.readyState == 'complete' && document.title")
            except Exception as e:  # not up yet
                error = e
                time.sleep(1)
        if not title:
            log = source.path("/tmp/chromium.log").read_text(errors="replace")[-3000:]
            return [f"Chromium did not load the page in {CHROMIUM_START_S} s ({type(error).__name__}: {error}); processes: "
                    f"{[(_comm(p), _state(p), _wchan(p)) for p in _tree(source.init)]}; its log ends: {log}"]
        say(f"the source loaded {title!r} in {CHROMIUM_START_S - (deadline - time.monotonic()):.0f} s")
        before = ax_names(source)
        clone, _, refused = fork_when_quiet(source, "chromium-1", args.builder, made, thaw=False)  # compared as forked
        ms = clone.build.grafted_ms if clone.build else 0.0
        plan = clone.build.plan if clone.build else None
        say(f"grafted in {ms:.1f} ms ({refused} attempts refused first for a transient state), "
            f"{len(plan.processes) if plan else 0} processes "
            f"({sum(p.placeholder for p in plan.processes) if plan else 0} session placeholders), "
            f"{len(plan.files) if plan else 0} open files, "
            f"{sum(len(p.remaps) for p in plan.processes) if plan else 0} mappings moved onto copies")
        problems += oracle(source, clone, pages_per_mapping=1)
        source.freeze(False)
        clone.freeze(False)
        started = time.monotonic()
        tree = ax_names(clone)
        say(f"the clone answered DevTools {time.monotonic() - started:.2f} s after its thaw: title "
            f"{evaluate(clone, 'document.title')!r}, {len(tree)} accessibility nodes (source {len(before)})")
        if tree != before:
            problems.append(f"the clone's accessibility tree is not the source's: {tree[:8]} vs {before[:8]}")
        evaluate(clone, "document.title = 'clone only'")
        if evaluate(source, "document.title") == "clone only" or evaluate(clone, "document.title") != "clone only":
            problems.append("a change made in the clone's page is not the clone's only")
        alive = [_state(p) for p in _tree(clone.init)]
        if "Z" in alive or len(alive) < len(plan.processes if plan else []) - sum(
                p.placeholder or p.zombie for p in (plan.processes if plan else [])):
            problems.append(f"a process of the clone died: {alive}")
    return problems


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _wchan(pid: int) -> str:
    """Where in the kernel ``pid``'s main thread sleeps."""
    try:
        return Path(f"/proc/{pid}/wchan").read_text().strip()
    except OSError:
        return ""


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def _guest_state() -> tuple[tuple[str, ...], int, str]:
    """What a leak would change: user processes outside the source (their names), mounts, and the module's live
    sessions and states."""
    names = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                flags = int(Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[6])
                cgroup = Path(f"/proc/{name}/cgroup").read_text()
                # user processes outside the source (whose shell starts a sleep now and then)
                if not flags & 0x00200000 and "treefork-faults\n" not in cgroup:  # PF_KTHREAD
                    names.append(Path(f"/proc/{name}/comm").read_text().strip())
    mounts = len(Path("/proc/self/mountinfo").read_text().splitlines())
    stats = Path("/sys/kernel/debug/bunshin/stats").read_text().split()
    return tuple(sorted(names)), mounts, " ".join(stats)


def _changes(before: tuple[tuple[str, ...], int, str], after: tuple[tuple[str, ...], int, str]) -> str:
    gone = sorted(set(before[0]) - set(after[0]))
    new = [n for n in set(after[0]) if after[0].count(n) > before[0].count(n)]
    return (f"processes {len(before[0])} -> {len(after[0])} (new: {new}, gone: {gone}), mounts {before[1]} -> "
            f"{after[1]}, module {before[2]!r} -> {after[2]!r}")


def _settled(baseline: tuple[tuple[str, ...], int, str]) -> tuple[tuple[str, ...], int, str]:
    """The guest's state once killed processes are reaped and RCU-freed objects gone (up to 10 s)."""
    deadline = time.monotonic() + 10
    state = _guest_state()
    while state != baseline and time.monotonic() < deadline:
        time.sleep(0.1)
        state = _guest_state()
    return state


def workload_faults(args: argparse.Namespace) -> list[str]:
    """Kill the builder, a helper (of the clone's pid 1, and of its last process) or the source at every named step
    of a tree fork of the shell workload: the fork fails with a typed error or yields a clone that is then removed;
    no half-built clone, process, mount or module object remains; the source runs on (or, killed, is reported gone
    and started again). Then kill the engine at every step, its own, the builder's and the helper's: the clone and
    the builder end by themselves (``engine_killed``)."""
    from bunshin.envs.runtime.treefork.errors import TreeForkFailed

    problems: list[str] = []
    cases = ([("builder", s, 1) for s in BUILDER_STEPS] + [("helper", s, 1) for s in HELPER_STEPS]
             + [("helper", s, 0) for s in HELPER_STEPS] + [("source", s, 1) for s in SOURCE_STEPS])
    with containers() as made:
        source = start("faults", ["/bin/sh", "-c", SHELL_SCRIPT])
        made.append(source)
        until_started(source, shell_started, "its job and its daemon")
        for n, (who, at, pid) in enumerate(cases):
            pid = pid or int(source.path("/tmp/job").read_text())  # the background job: always there
            baseline = _guest_state()
            source.freeze(True)
            clones: list[Container] = []
            outcome = "forked"
            try:
                clone, _ = fork(source, f"faults-{n}", args.builder, clones, fault=f"{who}:{at}", fault_pid=pid)
            except (TreeForkFailed, OSError, TimeoutError) as e:
                outcome = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
            for clone in clones:
                end(clone)
            source_alive = source.launcher is not None and source.launcher.poll() is None and \
                _state(source.init) not in ("", "Z", "X")
            if source_alive:
                source.freeze(False)
            else:
                end(source)
                made.remove(source)
                source = start("faults", ["/bin/sh", "-c", SHELL_SCRIPT])
                made.append(source)
                until_started(source, shell_started, "its job and its daemon")
                baseline = _guest_state()
            state = _settled(baseline)
            say(f"{who} killed at {at} (pid {pid}): {outcome}; source {'runs on' if source_alive else 'gone'}")
            if who != "source" and not source_alive:
                problems.append(f"{who} killed at {at}: the source died")
            if state != baseline:
                problems.append(f"{who} killed at {at}: the guest changed: {_changes(baseline, state)}")
            if who in ("builder", "helper") and outcome == "forked" and at != "released":
                problems.append(f"{who} killed at {at}: the fork still reported a clone")
        for n, (at, pid) in enumerate([(s, 1) for s in (*ENGINE_STEPS, *BUILDER_STEPS)]
                                      + [(s, 1) for s in HELPER_STEPS]):
            baseline = _guest_state()
            outcome, found = engine_killed(source, f"faults-engine-{n}", args.builder, at, pid)
            state = _settled(baseline)
            say(f"engine killed at {at}{f' (helper of pid {pid})' if at in HELPER_STEPS else ''}: {outcome}; "
                f"{'clean' if not found and state == baseline else 'PROBLEMS'}")
            problems += found
            if state != baseline:
                problems.append(f"engine killed at {at}: after the cleanup the guest changed: "
                                f"{_changes(baseline, state)}")
    return problems


def engine_killed(source: Container, name: str, builder: str, at: str, fault_pid: int = 1) -> tuple[str, list[str]]:
    """Run a tree fork of ``source`` in a process of its own, the engine, and kill it (SIGKILL) at step ``at``: one
    of its own (``ENGINE_STEPS``), the builder's or a helper's (that of clone pid ``fault_pid``). Then, before any
    cleanup: every process of the clone and the builder must be gone by themselves (the builder dies with its
    engine, the clone with its builder), and the module's objects with them. The cleanup a restarted engine does
    (the clone's mounts, its cgroup, its directory, found by name) is done here; the source, left frozen by the
    dead engine, is thawed and must run on. Returns how the engine ended and the problems."""
    global _engine_dies_at
    before = _guest_state()
    engine = os.fork()
    if engine == 0:  # the engine
        try:
            _engine_dies_at = at
            source.freeze(True)
            engine_step("frozen")
            fault = f"engine:{at}" if at not in ENGINE_STEPS else ""
            fork(source, name, builder, [], fault=fault, fault_pid=fault_pid)
        finally:
            os._exit(3)  # alive past its step: the parent says so
    _, status = os.waitpid(engine, 0)
    problems = []
    outcome = f"killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else \
        f"exited {os.waitstatus_to_exitcode(status)}"
    if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
        problems.append(f"engine killed at {at}: the engine was not killed there ({outcome})")
    cgroup = CGROUP / f"treefork-{name}"
    deadline = time.monotonic() + 10
    left: list[str] = []
    while time.monotonic() < deadline:  # what ends by itself: no cleanup has run yet
        state = _guest_state()
        procs = (cgroup / "cgroup.procs").read_text().split() if cgroup.exists() else []
        left = [f"clone processes {procs}"] if procs else []
        left += [f"processes {_changes(before, state)}"] if state[0] != before[0] else []
        left += [f"module objects {before[2]!r} -> {state[2]!r}"] if state[2] != before[2] else []
        if not left:
            break
        time.sleep(0.1)
    problems += [f"engine killed at {at}: before any cleanup, {what} remain" for what in left]
    base = WORK / name  # the restarted engine's cleanup, by name
    mounts = [Path(line.split()[4]) for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if line.split()[4].startswith(f"{base}/")]
    end(Container(name, base / "root", cgroup, mounts=sorted(mounts, key=lambda m: len(m.parts))))
    ticks = lines(source.path("/tmp/ticks"))
    source.freeze(False)
    deadline = time.monotonic() + 10
    while lines(source.path("/tmp/ticks")) <= ticks and time.monotonic() < deadline:
        time.sleep(0.1)
    if lines(source.path("/tmp/ticks")) <= ticks:
        problems.append(f"engine killed at {at}: the source, thawed, does not run on")
    return outcome, problems


def _tree(init: int) -> list[int]:
    """A running tree's processes, parents first; one that exits while it is read (a shell's ``sleep``) is left
    out rather than failing the read (the reader's ``walk`` is for frozen trees, where that cannot happen)."""
    from bunshin.envs.runtime.treefork.procfs import children

    out, queue = [], [init]
    while queue:
        pid = queue.pop(0)
        try:
            queue += children(pid)
        except (FileNotFoundError, ProcessLookupError):
            continue
        out.append(pid)
    return out


def _ns_pid(host_pid: int) -> int:
    """The process's number in its own namespace, or -1 once it has exited."""
    from bunshin.envs.runtime.treefork.procfs import last, status

    try:
        return last(status(host_pid)["NSpid"])
    except (FileNotFoundError, ProcessLookupError):
        return -1


def workload_engine(args: argparse.Namespace) -> list[str]:
    """The engine itself on the tree fork: ``bunshin eval`` of the embedded web shop with ``--backend kmod``, the
    prefix cache and speculation (GRPO groups: every sample a tree fork of its task's set-up workspace, every
    snapshot of the prefix tree a frozen tree fork, every cached step a fork of one, every speculative branch a tree
    fork; the selector trained on the reference's trajectories, so that it speculates). Every rollout must finish,
    steps must be served from the cache and branches started, and each rollout's steps (calls and observations) and
    reward must equal those of the same run made on the host with the userspace fork and no cache (``--reference``,
    made by ``kmod/vmtest`` before the boot): a clone that is not its source would show there."""
    if not args.reference:
        return ["the engine workload needs --reference (kmod/vmtest makes it)"]
    problems: list[str] = []
    env = dict(os.environ, BUNSHIN_STATE_DIR=str(WORK / "engine-state"), BUNSHIN_IMAGE_DIR=args.images or "",
               BUNSHIN_TREEFORK_BUILDER=args.builder)
    out = WORK / "engine"
    reference = _outcomes(Path(args.reference))
    doctor = subprocess.run([sys.executable, "-m", "bunshin.engine.cli", "doctor", "--json"], env=env,
                            capture_output=True, text=True, timeout=300)
    verdict = json.loads(doctor.stdout)["backends"]["kmod"] if doctor.stdout.startswith("{") else {}
    say(f"bunshin doctor here: kmod {verdict}")
    if not verdict.get("available"):
        problems.append(f"bunshin doctor says the kmod backend cannot run here: {verdict or doctor.stderr[-500:]}")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "bunshin.engine.cli", "eval", *engine_run(args), "--backend",
                           args.engine_backend, "--out", str(out), "--prefix-cache", "--speculate", "--spec-train",
                           args.reference], env=env, capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        return [f"bunshin eval exited {proc.returncode}: {proc.stdout[-1500:]} {proc.stderr[-3000:]}"]
    summary = json.loads((out / "summary.json").read_text())
    steps, spec = summary["steps_by_source"], summary.get("speculation") or {}
    say(f"{summary['rollouts']} rollouts in {time.monotonic() - started:.0f} s, {summary['failed']} failed, success "
        f"rate {summary['success_rate']:.2f}, steps {steps}; speculation {spec}")
    outcomes = _outcomes(out / "trajectories.jsonl")
    errors = [error for _, _, error in outcomes.values() if error]
    if summary["failed"] or summary["rollouts"] != len(reference):
        warnings = [line for line in proc.stderr.splitlines()
                    if any(w in line for w in ("WARNING", "Error", "broke", "refused", "failed"))][-6:]
        problems.append(f"{summary['failed']} of {summary['rollouts']} rollouts failed (of {len(reference)}); the "
                        f"first error: {errors[:1]}; prefix tree {summary.get('prefix')}; the run's last warnings: "
                        f"{warnings}")
    if not (steps["cached"] > 0 and spec.get("speculated", 0) > 0):
        problems.append(f"no step served from the cache ({steps['cached']}) or no branch started "
                        f"({spec.get('speculated')}): the prefix tree and speculation did not fork")
    differ = sorted(k for k in reference.keys() | outcomes.keys()
                    if reference.get(k, (None,))[:2] != outcomes.get(k, (None,))[:2])
    say(f"{len(outcomes) - len(differ)} of {len(outcomes)} rollouts equal to the userspace fork's on the host (steps "
        f"and reward)")
    if differ:
        problems.append(f"rollouts {differ[:4]} differ from the userspace fork's: "
                        f"{_first_difference(Path(args.reference), out / 'trajectories.jsonl', differ[0])}")
    return problems


def _first_difference(reference: Path, ours: Path, key: tuple[str, int]) -> str:
    """Where rollout ``key`` first differs between the two runs: the step, its calls, its observations."""
    def steps(path: Path) -> tuple[list[dict], float | None]:
        for line in path.read_text().splitlines():
            t = json.loads(line)
            if (t["task_id"], t["sample"]) == key:
                return t["steps"], t["reward"]
        return [], None

    (a, reward_a), (b, reward_b) = steps(reference), steps(ours)
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        ox = {k: x["observation"].get(k) for k in ("output", "exit_code", "error")}
        oy = {k: y["observation"].get(k) for k in ("output", "exit_code", "error")}
        if x["call"] != y["call"] or ox != oy:
            return (f"step {i} ({y.get('source')}): call {x['call']} / {y['call']}; observation "
                    f"{json.dumps(ox)[:1500]} / {json.dumps(oy)[:1500]}")
    return f"{len(a)} / {len(b)} steps, reward {reward_a} / {reward_b}"


# the engine workload's runs (the reference is made on the host with the same arguments): 3 tasks of the web
# shop, groups of 3, every sample a fork, one rollout at a time: a node is admitted to the prefix tree when a
# second sample executes its call, so the third sample is served from it whatever the timing (three at a time,
# in lockstep on a loaded machine, all three executed every call and nothing was cached: CI, 2026-12-05)
# (the policy's reasoning at half its modelled time: under TCG a prediction at 0.05 came after its decision)
ENGINE_RUN = ["--suite", "webshop", "--limit", "3", "--group-size", "3", "--concurrency", "1", "--max-steps", "12",
              "--seed", "0", "--time-scale", "0.5"]


def engine_run(args: argparse.Namespace) -> list[str]:
    """The engine workload's ``bunshin eval`` arguments: ``ENGINE_RUN``, or ``--engine-run`` (comma-separated:
    it travels through the guest's init script)."""
    return args.engine_run.split(",") if args.engine_run else ENGINE_RUN


def _outcomes(trajectories: Path) -> dict[tuple[str, int], tuple[str, float, str]]:
    """Each rollout's (task, sample): a digest of its calls and observations (their text, exit code, error), its
    reward, its error."""
    import hashlib

    out = {}
    for line in trajectories.read_text().splitlines():
        t = json.loads(line)
        text = json.dumps([(s["call"], {k: s["observation"].get(k) for k in ("output", "exit_code", "error")})
                           for s in t["steps"]], sort_keys=True)
        out[(t["task_id"], t["sample"])] = (hashlib.sha256(text.encode()).hexdigest()[:16], t["reward"],
                                            t.get("error") or "")
    return out


WORKLOADS: dict[str, Callable[[argparse.Namespace], list[str]]] = {"threads": workload_threads,
                                                                    "shell": workload_shell,
                                                                    "pty": workload_pty,
                                                                    "sockets": workload_sockets,
                                                                    "webshop": workload_webshop,
                                                                    "channel": workload_channel,
                                                                    "xdesktop": workload_xdesktop,
                                                                    "calc": workload_calc,
                                                                    "chromium": workload_chromium,
                                                                    "faults": workload_faults,
                                                                    "engine": workload_engine}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("workload", choices=sorted(WORKLOADS))
    ap.add_argument("--builder", required=True)
    ap.add_argument("--threads-bin")
    ap.add_argument("--images", help="the workspace image store (BUNSHIN_IMAGE_DIR)")
    ap.add_argument("--sockets-app", default=str(Path(__file__).resolve().parent / "sockets_app.py"))
    ap.add_argument("--shop-app", default=str(Path(__file__).resolve().parent / "shop_app.py"))
    ap.add_argument("--pty-app", default=str(Path(__file__).resolve().parent / "pty_app.py"))
    ap.add_argument("--generations", type=int, default=1)
    ap.add_argument("--engine-backend", default="kmod", help="the engine workload's --backend")
    ap.add_argument("--reference", help="the engine workload's run made on the host (trajectories.jsonl)")
    ap.add_argument("--engine-run", help="the engine workload's eval arguments instead of ENGINE_RUN, comma-separated "
                                         "(--suite,osworld,--limit,1,...)")
    ap.add_argument("--make-reference", metavar="DIR",
                    help="make the engine workload's reference on this host (the userspace fork) in DIR, and exit")
    args = ap.parse_args()
    if args.make_reference:
        return subprocess.run([sys.executable, "-m", "bunshin.engine.cli", "eval", *engine_run(args), "--backend", "cow",
                               "--out", args.make_reference], capture_output=True).returncode
    WORK.mkdir(parents=True, exist_ok=True)
    try:
        with layer_pool():
            problems = WORKLOADS[args.workload](args)
    except Exception as e:  # the verdict names it; the TAP line fails
        problems = [f"{type(e).__name__}: {e}"]
    for problem in problems:
        say(f"FAIL: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

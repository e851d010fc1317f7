"""Application processes: long-lived programs an application starts in its workspace (a browser, a display server).

Owns: starting one as the agent user, as PID 1 of a PID namespace of its own (killing it ends every process it
started, and it sees no other process of the machine), in a mount namespace of its own with private tmpfs mounts
(its profile, its caches: nothing it writes lands in the workspace's layers, so a file snapshot never catches it
mid-write), with chosen descriptors at chosen numbers (a browser's DevTools pipe on 3 and 4), opted into KSM when
asked, dying with the host; killing and reaping them; and, in a clone, forgetting the source's (they are not ours).
On a tree-fork host (``fork/kmod.py``: the host is pid 1 of the workspace's own PID namespace, and the tree fork
clones one PID and one mount namespace) a program runs flat instead: in the host's namespaces, in a cgroup of its
own below the workspace's (killing it kills that cgroup: what it started, daemons that left its session too), its
"tmpfs" paths directories of the workspace's own files (the fork freezes every process before it snapshots them);
a clone keeps its source's programs, which the tree fork cloned (``become_clones``).
Must never: let one inherit a descriptor of the host's other than those it was given, or outlive the host.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..app import ToolError
from . import image, rootfs, syscalls
from .cgroups import join_by_fds, kill_by_fds

APP_OOM_SCORE_ADJ = 800  # like an agent's: the OOM killer takes a browser's memory before the host
FIRST_TARGET_FD = 3


LOG_KEPT = 1 << 20  # of a program's output, the last MiB at most (``log_tail``)


@dataclass
class AppProcess:
    """One started program: ``pid`` in the hosts' PID namespace (PID 1 of its own); its standard output and error
    go to ``log_fd``, an anonymous file of the host's (``log_tail`` reads its end)."""

    name: str
    proc: subprocess.Popen[bytes]
    log_fd: int
    group: str | None = None  # a flat one's cgroup, below each of ``cgroup_fds`` (a tree-fork host's)
    cgroup_fds: tuple[int, ...] = ()

    def log_tail(self, limit: int = 4096) -> str:
        """The last ``limit`` bytes the program wrote (what to show when it failed); the file is cut back when it
        grew past ``LOG_KEPT``."""
        size = os.fstat(self.log_fd).st_size
        tail = os.pread(self.log_fd, limit, max(0, size - limit)).decode("utf-8", "replace")
        if size > LOG_KEPT:
            os.ftruncate(self.log_fd, 0)  # the program writes with O_APPEND-less offsets: it goes on past a hole
        return tail

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL its namespace's PID 1 (the kernel then kills every process in it) and reap it; a flat one: every
        process of its cgroup (reaped: the host is their parent or, once orphaned, their reaper), then the cgroup."""
        if self.group is not None:
            kill_by_fds(list(self.cgroup_fds), self.group)
            self.proc.wait()  # reaped already: Popen takes ECHILD as gone
            _remove_group(self.cgroup_fds, self.group)
        elif self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.forget()

    def forget(self) -> None:
        if self.log_fd >= 0:
            os.close(self.log_fd)
            self.log_fd = -1


class AdoptedProcess:
    """A program another host started and lent to this one (a warm-pool slot's browser): not our child, so it is
    killed through a pidfd (the kernel then kills its whole PID namespace) and its lender reaps it; its output is
    the lender's."""

    def __init__(self, name: str, pid: int):
        self.name, self.pid = name, pid
        self.pidfd = os.pidfd_open(pid)

    def log_tail(self, limit: int = 4096) -> str:
        return ""

    def kill(self) -> None:
        if self.pidfd >= 0:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        self.forget()

    def forget(self) -> None:
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1


class AppProcesses:
    """The application processes of one workspace host. ``private_fds()`` lists the host's descriptors a process
    must not keep (asked at every start). ``own_pidns_fd`` -1: a tree-fork host's, flat (see the module's
    docstring), each in a cgroup below ``cgroup_rel`` in each hierarchy of ``cgroup_fds``."""

    def __init__(self, own_pidns_fd: int, private_fds: Callable[[], list[int]], cgroup_fds: list[int] | None = None,
                 cgroup_rel: str = "", refuse: str = ""):
        """``refuse``: why this workspace starts none (``start`` raises ToolError saying so)."""
        self.own_pidns_fd = own_pidns_fd  # the hosts' PID namespace, to come back to after starting one
        self.private_fds = private_fds
        self.flat = own_pidns_fd < 0
        self.refuse = refuse
        if self.flat and not refuse and not (cgroup_fds and cgroup_rel):
            raise ValueError("flat application processes need the workspace's cgroup")
        self.cgroup_fds, self.cgroup_rel = tuple(cgroup_fds or ()), cgroup_rel
        self.started = 0  # how many were started: each flat one's cgroup is named by its number
        self.running: list[AppProcess] = []

    def start(self, name: str, argv: list[str], *, env: Mapping[str, str], fds: Mapping[int, int] | None = None,
              tmpfs: Mapping[str, int] | None = None, merge_memory: bool = False) -> AppProcess:
        """Start ``argv`` (an absolute path first) as the agent user. ``fds``: target number -> our descriptor,
        each dup'ed onto its number in the child (numbers from 3); ``tmpfs``: absolute path -> size in bytes,
        mounted empty and owned by the agent in the process's mount namespace (created if missing);
        ``merge_memory``: KSM may merge its pages (``PR_SET_MEMORY_MERGE``, inherited by what it starts).
        Its output goes to an anonymous file of the host's (``AppProcess.log_tail``), never to an observation."""
        if self.refuse:
            raise ToolError(f"{name}: {self.refuse}")
        if not argv or not os.path.isabs(argv[0]):
            raise ToolError(f"an application process needs an absolute program path, got {argv[:1]!r}")
        given = dict(fds or {})
        if any(target < FIRST_TARGET_FD for target in given):
            raise ToolError(f"descriptor targets start at {FIRST_TARGET_FD}, got {sorted(given)}")
        # Move our ends above every target first, so a dup2 onto a target never closes a source still to come.
        high = {target: _dup_above(fd, max(given, default=0)) for target, fd in given.items()}
        private = [fd for fd in self.private_fds() if fd not in high.values()]
        log_fd = os.memfd_create(f"{name}-log", os.MFD_CLOEXEC)
        self.started += 1
        group = f"{self.cgroup_rel}/app-{self.started}" if self.flat else None
        try:
            if group is not None:
                _make_flat(self.cgroup_fds, group, dict(tmpfs or {}))
            else:
                syscalls.unshare(syscalls.CLONE_NEWPID)
            try:
                proc = subprocess.Popen(
                    argv, cwd="/", env=dict(env), stdin=subprocess.DEVNULL, stdout=log_fd,
                    stderr=log_fd, start_new_session=True, pass_fds=tuple(given),
                    preexec_fn=lambda: _preexec(high, dict(tmpfs or {}), private, merge_memory,
                                                self.cgroup_fds if group else (), group),
                )
            finally:
                if group is None:
                    syscalls.setns(self.own_pidns_fd, syscalls.CLONE_NEWPID)
        except BaseException:
            os.close(log_fd)
            if group is not None:
                _remove_group(self.cgroup_fds, group)
            raise
        finally:
            for fd in high.values():
                os.close(fd)
        started = AppProcess(name=name, proc=proc, log_fd=log_fd, group=group,
                             cgroup_fds=self.cgroup_fds if group else ())
        self.running = [p for p in self.running if p.proc.returncode is None]
        self.running.append(started)
        return started

    def kill_all(self) -> None:
        for process in self.running:
            process.kill()
        self.running = []

    def become_clones(self, cgroup_rel: str) -> None:
        """In a tree-fork clone: the programs listed are the clone's own (the tree fork cloned them, each into the
        cgroup of the same name below the clone's): they stay, named by the clone's cgroup."""
        self.cgroup_rel = cgroup_rel
        for process in self.running:
            if process.group is not None:
                process.group = f"{cgroup_rel}/{process.group.rsplit('/', 1)[1]}"

    def forget_all(self) -> None:
        """In a clone: the processes listed are the source's, neither our children nor ours to kill."""
        for process in self.running:
            process.proc.returncode = 0  # never waited for here (Popen would reap another host's child)
            process.forget()
        self.running = []


def _dup_above(fd: int, floor: int) -> int:
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, max(floor + 1, 10))


def _remove_group(cgroup_fds: tuple[int, ...], group: str) -> None:
    for fd in cgroup_fds:
        with contextlib.suppress(OSError):
            os.rmdir(group, dir_fd=fd)


def _make_flat(cgroup_fds: tuple[int, ...], group: str, tmpfs: dict[str, int]) -> None:
    """A flat program's cgroup (in each hierarchy) and its "tmpfs" paths, as directories of the workspace's own
    files: made if missing (the agent's, 0700), left as they are if present (a program started again finds its
    files; /tmp stays the workspace's /tmp)."""
    for fd in cgroup_fds:
        os.mkdir(group, dir_fd=fd)
    for path in tmpfs:
        if not os.path.isdir(path):
            os.makedirs(path, mode=0o700)
            os.chown(path, image.AGENT_UID, image.AGENT_GID)


def _preexec(fds: dict[int, int], tmpfs: dict[str, int], private: list[int], merge_memory: bool,
             cgroup_fds: tuple[int, ...] = (), group: str | None = None) -> None:
    """In the child, PID 1 of its new namespace, before exec: its own mounts (a /proc of its namespace, the
    tmpfs mounts), KSM opt-in, the OOM score, the given descriptors onto their numbers and the host's private ones
    closed, then the agent user for good and death with the host (set last: a change of user clears it). A flat
    one (``group``): its cgroup instead of namespaces and mounts."""
    if group is not None:
        join_by_fds(list(cgroup_fds), group)
    else:
        syscalls.unshare(syscalls.CLONE_NEWNS)
        syscalls.mount(None, "/", None, syscalls.MS_REC | syscalls.MS_PRIVATE)
        with contextlib.suppress(OSError):
            syscalls.umount("/proc", syscalls.MNT_DETACH)
        rootfs.mount_proc()
        for path, size in tmpfs.items():
            os.makedirs(path, exist_ok=True)
            syscalls.mount("tmpfs", path, "tmpfs", syscalls.MS_NOSUID | syscalls.MS_NODEV,
                           f"mode=0700,size={size},uid={image.AGENT_UID},gid={image.AGENT_GID}")
    if merge_memory:
        syscalls.prctl(syscalls.PR_SET_MEMORY_MERGE, 1)
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write(str(APP_OOM_SCORE_ADJ))
    for fd in private:  # first: a private descriptor may have the number a given one is about to take
        with contextlib.suppress(OSError):
            os.close(fd)
    for target, fd in fds.items():
        os.dup2(fd, target)
    os.setgroups([])
    os.setresgid(image.AGENT_GID, image.AGENT_GID, image.AGENT_GID)
    os.setresuid(image.AGENT_UID, image.AGENT_UID, image.AGENT_UID)
    syscalls.prctl(syscalls.PR_SET_NO_NEW_PRIVS, 1)
    syscalls.prctl(syscalls.PR_SET_PDEATHSIG, signal.SIGKILL)

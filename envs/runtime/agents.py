"""Agent commands: what a workspace runs on an agent's behalf, inside the host process's care.

Owns: the workspace's agent PID namespace (made at the first command, one level below the hosts', with a tiny
exec'd init as its PID 1), running ``/bin/sh -c`` as the unprivileged agent user (uid 65000, no_new_privs, its own
cgroup that the fork freezes, the OOM killer's first pick), reading its output bounded in size and time, killing
every agent process at once, and freezing them while the workspace forks or checkpoints.
Must never: let a command inherit a descriptor of the host's, or keep running past its timeout.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from ..app import ToolError
from ..records import Observation
from . import image, rootfs, syscalls
from .cgroups import AGENT_GROUP, freeze_by_fds, join_by_fds, kill_by_fds

MAX_OUTPUT = 64 << 10
AGENT_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": image.AGENT_HOME,
    "USER": image.AGENT_USER,
    "LANG": "C.UTF-8",
    "TERM": "dumb",
    # CPython trusts a cached .pyc whose source has the same size and whole-second mtime: an edit of the same
    # length saved within a second of the last run (agents act that fast when no latency is modelled) would run
    # the old bytecode. Agents' interpreters write none; an isolated run (-I, the graders') still may, after the
    # agent is done.
    "PYTHONDONTWRITEBYTECODE": "1",
}
AGENT_OOM_SCORE_ADJ = 800


def agent_env(image_env: dict[str, str]) -> dict[str, str]:
    """The agent commands' environment: ours, with an image's ``Env`` over it except the agent's own HOME and
    USER (the workspace's user runs them, whatever user the image names)."""
    keep = {"HOME", "USER"}
    return {**AGENT_ENV, **{k: v for k, v in image_env.items() if k not in keep}}


class Agents:
    """The agent processes of one workspace. ``private_fds()`` lists the host's descriptors a command must not
    keep (asked at every command: the set changes as workers come and clones re-open)."""

    def __init__(self, cgroup_fds: list[int], cgroup_rel: str, own_pidns_fd: int,
                 private_fds: Callable[[], list[int]], namespace: bool = True,
                 image_env: dict[str, str] | None = None, image_cwd: str = ""):
        """``namespace=False`` (a tree-fork host, pid 1 of its own namespace): commands run in the host's PID
        namespace, the host reaps their orphans (``reap_orphans``) and kills them through their cgroup.
        ``image_env``, ``image_cwd``: a Docker image's ``Env`` (over ours, but the agent's HOME and USER, which are
        the workspace's) and ``WorkingDir`` (the commands' directory when it exists; else the agent's home)."""
        self.namespace = namespace
        self.env = agent_env(image_env or {})
        self.image_cwd = image_cwd
        self.cgroup_fds = cgroup_fds
        self.group = f"{cgroup_rel}/{AGENT_GROUP}"
        self.own_pidns_fd = own_pidns_fd  # the hosts' PID namespace, to come back to after spawning
        self.private_fds = private_fds
        self.init_pid: int | None = None
        self.pidns_fd: int | None = None

    # -- running ------------------------------------------------------------------------------------------------
    def run(self, cmd: str, timeout_s: float) -> Observation:
        """Run ``cmd`` with /bin/sh as the agent user in the workspace's PID namespace. A command still running
        after ``timeout_s`` is killed, and every agent process with it (an agent's command: its background jobs
        too)."""
        return self._run(cmd, timeout_s, kill_all=True)

    def run_alone(self, cmd: str, timeout_s: float) -> Observation:
        """``run``, for an app's own command (a VM API's, an observation's): past ``timeout_s`` it is killed with
        its session only (what it started there), never a program it started in a session of its own (``setsid``:
        the application a task set up), as OSWorld's VM server kills a command that ran over."""
        return self._run(cmd, timeout_s, kill_all=False)

    def _run(self, cmd: str, timeout_s: float, kill_all: bool) -> Observation:
        if self.namespace:
            syscalls.setns(self._ensure_namespace(), syscalls.CLONE_NEWPID)
        else:
            self.init_pid = 0  # no init: ``running`` says commands ran
        try:
            private = self.private_fds()
            proc = subprocess.Popen(
                ["/bin/sh", "-c", cmd], cwd=self._cwd(), env=self.env, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=lambda: _preexec(self.cgroup_fds, self.group, private),
            )
        finally:
            if self.namespace:
                syscalls.setns(self.own_pidns_fd, syscalls.CLONE_NEWPID)
        out, timed_out = _read_bounded(proc, timeout_s)
        if timed_out and kill_all:
            self.kill_all()  # a timed-out command takes the whole agent namespace with it (its background jobs too)
        elif timed_out:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # its session's one process group (start_new_session)
        proc.wait()
        text = out.decode("utf-8", "replace")
        if timed_out:
            return Observation(output=text, exit_code=-signal.SIGKILL, error=f"command timed out after {timeout_s:g}s")
        return Observation(output=text, exit_code=proc.returncode)

    def _cwd(self) -> str:
        return self.image_cwd if self.image_cwd and os.path.isdir(self.image_cwd) else image.AGENT_HOME

    def _ensure_namespace(self) -> int:
        if self.pidns_fd is not None:
            return self.pidns_fd
        syscalls.unshare(syscalls.CLONE_NEWPID)
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            _init(ready_w, self.cgroup_fds, self.group)
        os.close(ready_w)
        ok = os.read(ready_r, 1)
        os.close(ready_r)
        syscalls.setns(self.own_pidns_fd, syscalls.CLONE_NEWPID)
        if ok != b"1":
            os.waitpid(pid, 0)
            raise ToolError("could not start the workspace's agent PID namespace")
        self.init_pid = pid
        # Our own /proc view now is the agent namespace's: PID 1 there is the init we just made.
        self.pidns_fd = os.open("/proc/1/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        return self.pidns_fd

    def kill_all(self) -> None:
        """SIGKILL the agent namespace's init, which takes every agent process with it.

        The namespace is gone only once all its processes are reaped, and the commands themselves are our
        children: so reap any child until the init is among them (waiting for the init alone would deadlock).
        """
        init, self.init_pid = self.init_pid, None
        self.close_namespace_fd()
        if not self.namespace and not self.cgroup_fds:  # a container host's: every process of the agent's uid
            signal_agent_uid(signal.SIGKILL, until_gone=True)
            return
        if not self.namespace:  # whatever is in the agents' cgroup (a tree-fork clone's too: its source's jobs)
            kill_by_fds(self.cgroup_fds, self.group)
            return
        if init is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(init, signal.SIGKILL)
        while True:
            try:
                if os.waitpid(-1, 0)[0] == init:
                    return
            except ChildProcessError:
                return

    @staticmethod
    def reap_orphans(keep: tuple[int, ...]) -> None:
        """Without an agent namespace, the host is pid 1: reap every exited child of ours that is not one of
        ``keep`` (workers, whose exit their own owner notices), background jobs orphaned onto us above all."""
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid in keep:
                return
            os.waitpid(info.si_pid, 0)

    def close_namespace_fd(self) -> None:
        if self.pidns_fd is not None:
            os.close(self.pidns_fd)
            self.pidns_fd = None

    # -- around forks and checkpoints ----------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        """Whether agent commands ran here (their namespace's init is alive): only then is there anything to freeze."""
        return self.init_pid is not None

    def freeze(self) -> None:
        """Freeze the agents (background jobs must not write while the files are snapshotted). A caller that saw
        ``running`` thaws with ``thaw()`` even when this raised: a freeze that timed out half-froze."""
        if self.running and not self.cgroup_fds:  # a container host's agents: stopped, found by their uid
            signal_agent_uid(signal.SIGSTOP)
        elif self.running:
            freeze_by_fds(self.cgroup_fds, self.group, True)

    def thaw(self) -> None:
        if not self.cgroup_fds:
            signal_agent_uid(signal.SIGCONT)
            return
        freeze_by_fds(self.cgroup_fds, self.group, False)

    def become_clones(self, cgroup_rel: str) -> None:
        """In a clone: the source's agent namespace is not ours; ours starts with the clone's first command."""
        self.close_namespace_fd()
        self.init_pid = None
        self.group = f"{cgroup_rel}/{AGENT_GROUP}"


def agent_uid_pids() -> list[int]:
    """Every process whose real uid is the agent's (a container host's view of its agents: no cgroup of its own;
    an agent cannot change its uid: no capabilities, no new privileges)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/status") as f:
                    uid = next(line for line in f if line.startswith("Uid:")).split()[1]
            except (OSError, StopIteration):
                continue
            if int(uid) == image.AGENT_UID:
                found.append(int(entry.name))
    return found


def signal_agent_uid(signum: int, until_gone: bool = False, timeout_s: float = 10.0) -> None:
    """Send ``signum`` to every agent process; ``until_gone``: again (a fork meanwhile is caught on the next pass)
    until none is left, reaping those that are our children. ``TimeoutError`` if some remain after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        pids = agent_uid_pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        if not until_gone:
            return
        for pid in pids:  # ours once their parents died (we are pid 1): their zombies would be listed forever
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        if not pids:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"agent processes {pids[:10]} still alive after {timeout_s:g} s")
        time.sleep(0.005)


def _read_bounded(proc: subprocess.Popen[bytes], timeout_s: float) -> tuple[bytes, bool]:
    """The command's output up to MAX_OUTPUT bytes (the rest is read and dropped, so a chatty command neither
    blocks nor fills the host's memory), and whether it timed out."""
    if proc.stdout is None:
        raise ValueError("the command was started without a pipe for its output")
    deadline = time.monotonic() + timeout_s
    kept = bytearray()
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                proc.stdout.close()
                return bytes(kept), True
            if not sel.select(left):
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                proc.stdout.close()
                return bytes(kept), False
            if len(kept) < MAX_OUTPUT:
                kept += chunk[: MAX_OUTPUT - len(kept)]


def _preexec(cgroup_fds: list[int], agent_group: str, private: list[int]) -> None:
    """In the agent command's child, before exec: join the agents' cgroup, make it the OOM killer's first pick,
    close the host's private descriptors, then drop to the agent user for good (the score must be written while
    we still own our /proc entry; the descriptors must be gone before anything runs as the agent)."""
    join_by_fds(cgroup_fds, agent_group)
    for fd in [*private, *cgroup_fds]:
        with contextlib.suppress(OSError):
            os.close(fd)
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write(str(AGENT_OOM_SCORE_ADJ))
    os.setgroups([])
    os.setresgid(image.AGENT_GID, image.AGENT_GID, image.AGENT_GID)
    os.setresuid(image.AGENT_UID, image.AGENT_UID, image.AGENT_UID)
    syscalls.prctl(syscalls.PR_SET_NO_NEW_PRIVS, 1)


# PID 1 of the agent namespace after its exec: reaps orphans until killed. Blocking SIGCHLD and waiting for it
# with sigwait leaves no window in which a child could exit unnoticed.
INIT_CODE = """
import os, signal
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
while True:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
    signal.sigwait({signal.SIGCHLD})
"""


def _init(ready_w: int, cgroup_fds: list[int], agent_group: str) -> None:
    """PID 1 of the agent namespace: mount its /proc, then exec a tiny reaper. Never returns.

    It execs (rather than staying a fork of the host) so that it holds none of the application's memory: a
    workspace's memory is then the host's alone, and the init costs well under 1 MiB.
    """
    try:
        join_by_fds(cgroup_fds, agent_group)
        os.closerange(3, ready_w)
        os.closerange(ready_w + 1, 65536)
        syscalls.prctl(syscalls.PR_SET_PDEATHSIG, signal.SIGKILL)
        with contextlib.suppress(OSError):
            syscalls.umount("/proc", syscalls.MNT_DETACH)
        rootfs.mount_proc()
        os.write(ready_w, b"1")
        os.close(ready_w)
        os.execv(sys.executable, [sys.executable, "-S", "-I", "-c", INIT_CODE])
    except BaseException:
        os._exit(1)

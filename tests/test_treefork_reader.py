"""The tree fork's reader on real process trees (each in a pid namespace of its own, stopped): the plan of a
multi-threaded program with a pipe, an epoll, an eventfd and a shared memfd; and every refusal, one by one, naming
the process and the descriptor or mapping. The build itself runs where the module loads: ``kmod/vmtest``
(``treefork: <workload>``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bunshin.envs.errors import ForkFailed
from bunshin.envs.runtime import syscalls
from bunshin.envs.runtime.treefork.oracle import describe
from bunshin.envs.runtime.treefork.plan import render
from bunshin.envs.runtime.treefork.procfs import in_namespace_of
from bunshin.envs.runtime.treefork.reader import TreeForkRefused, read_tree

KMOD = Path(__file__).resolve().parent.parent / "kmod"
PYTHON = "/usr/bin/python3"
SHM = "import ctypes; c = ctypes.CDLL(None); c.shmat.restype = ctypes.c_void_p"  # SysV IPC through libc

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                reason="needs root (pid namespaces) and unshare")


class Tree:
    def __init__(self, argv: list[str], threads: int = 1, keeps_pipe: int = 0, unshare: tuple[str, ...] = (),
                 pass_fds: tuple[int, ...] = ()):
        self.launcher = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", *unshare, *argv],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, close_fds=True, start_new_session=True,
                                         pass_fds=pass_fds)
        assert self.launcher.stdout is not None
        ready = self.launcher.stdout.readline()
        assert ready.strip() == b"ready", ready
        self.init = int(Path(f"/proc/{self.launcher.pid}/task/{self.launcher.pid}/children").read_text().split()[0])
        # until it has its threads and has let go of our pipe (but what it keeps of it on purpose)
        ours = f"pipe:[{os.fstat(self.launcher.stdout.fileno()).st_ino}]"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (len(os.listdir(f"/proc/{self.init}/task")) < threads
                                               or self._links_to(ours) > keeps_pipe):
            time.sleep(0.02)
        self._stop_all()
        time.sleep(0.05)

    def _links_to(self, target: str) -> int:
        """How many descriptors of pid 1 and its children (a child forked before pid 1 let go of the pipe holds it
        until it runs its own dup2) point at ``target``."""
        links = []
        children = Path(f"/proc/{self.init}/task/{self.init}/children").read_text().split()
        for pid in [self.init, *map(int, children)]:
            with contextlib.suppress(FileNotFoundError):
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    with contextlib.suppress(FileNotFoundError):
                        links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        return links.count(target)

    def _stop_all(self) -> None:
        os.kill(self.init, signal.SIGSTOP)
        for child in Path(f"/proc/{self.init}/task/{self.init}/children").read_text().split():
            os.kill(int(child), signal.SIGSTOP)

    def end(self) -> None:
        os.killpg(self.launcher.pid, signal.SIGKILL)
        self.launcher.wait()
        assert self.launcher.stdout is not None
        self.launcher.stdout.close()


@pytest.fixture
def tree() -> Iterator[list[Tree]]:
    made: list[Tree] = []
    yield made
    for t in made:
        t.end()


def python_tree(made: list[Tree], code: str, keeps_pipe: int = 0, unshare: tuple[str, ...] = (),
                pass_fds: tuple[int, ...] = ()) -> Tree:
    """A Python process (pid 1 of its namespace, in the other namespaces ``unshare`` names: "--ipc") that runs
    ``code``, says ready on what fd 1 was (a pipe to us; fd 1 is /dev/null by then, so that no pipe crosses the
    tree's boundary) and sleeps."""
    program = (f"import os, sys, time\n{code}\n"
               "w = os.dup(1); n = os.open('/dev/null', os.O_RDWR); os.dup2(n, 1); os.close(n)\n"
               "os.write(w, b'ready\\n'); os.close(w)\n"
               "while True: time.sleep(1)\n")
    t = Tree([PYTHON, "-c", program], keeps_pipe=keeps_pipe, unshare=unshare, pass_fds=pass_fds)
    made.append(t)
    return t


def test_a_threaded_program_with_a_pipe_an_epoll_an_eventfd_a_memfd_and_a_zombie_reads_into_a_faithful_plan(
        tree: list[Tree], tmp_path: Path) -> None:
    binary = tmp_path / "threads"
    subprocess.run(["gcc", "-O2", "-static", "-o", str(binary), str(KMOD / "treefork" / "threads.c"), "-lpthread"],
                   check=True)
    code = (f"import os; w = os.dup(1); n = os.open('/dev/null', os.O_RDWR); os.dup2(n, 1); os.close(n); "
            f"os.write(w, b'ready\\n'); os.close(w); "
            f"os.execv('{binary}', ['threads', '4', '{tmp_path}/threads.out'])")
    t = Tree([PYTHON, "-c", code], threads=4)
    tree.append(t)
    plan = read_tree(t.init, hostname="box")
    [proc, zombie] = plan.processes
    assert proc.pid == 1 and proc.threads == [3, 4, 5]  # the zombie is pid 2
    assert zombie.zombie and zombie.ppid == 1 and zombie.exit_code == 3 << 8  # its never-reaped child
    kinds = {f.oid: f.kind for f in plan.files}
    by_num = {d.num: kinds[d.oid] for d in proc.descriptors}
    assert sorted(by_num.values()).count("pipe") == 1 and "pipe_w" in by_num.values()
    assert {"memfd", "epoll", "eventfd", "file"} <= set(by_num.values())
    [memfd] = [f for f in plan.files if f.kind == "memfd"]
    assert memfd.path == "treefork-threads"
    # the mapping of the memfd and its descriptor are one copy
    assert [r.oid for r in proc.remaps] == [memfd.oid]
    [epoll_fd] = [num for num, kind in by_num.items() if kind == "epoll"]
    # added again by the process, with the numbers it added them with
    assert {(w.pid, w.epoll_fd) for w in plan.watches} == {(1, epoll_fd)}
    assert {by_num[w.target_fd] for w in plan.watches} == {"pipe", "eventfd"}
    text = render(plan)
    assert text.startswith(f"close_from {max(by_num) + 1}\n") and text.endswith("end\n")
    assert f"proc 1 {t.init} 0 0 0 17 0 0\n" in text, [line for line in text.splitlines() if line.startswith("proc")]


REFUSALS = {
    "a Unix socket connected outside the tree": (
        "import socket; c = socket.socket(socket.AF_UNIX); c.connect('\\0bunshin-treefork-test')", "fd",
        "connected outside the tree"),
    "a listener with a connection not yet accepted": (
        "import socket; l = socket.socket(socket.AF_UNIX); l.bind('\\0bunshin-tf-l'); l.listen(1); "
        "c = socket.socket(socket.AF_UNIX); c.connect('\\0bunshin-tf-l')", "fd", "not yet accepted"),
    "a datagram pair with a message in flight": (
        "import socket; a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM); a.send(b'x')", "fd",
        "messages in flight"),
    "a UDP socket": ("import socket; u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)", "fd",
                     "other than a TCP listener"),
    "a TCP connection": (
        "import socket; l = socket.create_server(('127.0.0.1', 0)); "
        "c = socket.create_connection(l.getsockname()); a, _ = l.accept()", "fd", "other than a TCP listener"),
    "a TCP connection its peer has closed": (
        "import socket, time; l = socket.create_server(('127.0.0.1', 0)); "
        "c = socket.create_connection(l.getsockname()); a, _ = l.accept(); c.close(); time.sleep(0.2)", "fd",
        "closed by its peer"),
    "a timerfd": ("import ctypes; ctypes.CDLL(None).timerfd_create(1, 0)", "fd", "a timerfd"),
    "an inotify with events queued": (
        "import ctypes; c = ctypes.CDLL(None); i = c.inotify_init(); c.inotify_add_watch(i, b'/tmp', 0x100); "
        "p = f'/tmp/bunshin-tf-inotify-{os.getppid()}'; open(p, 'w').close(); os.unlink(p)", "fd", "events queued"),
    "a signalfd": ("import ctypes; m = (ctypes.c_ulong * 16)(); assert ctypes.CDLL(None).signalfd(-1, m, 0) >= 0", "fd",
                   "a signalfd"),
    "a pipe to outside": ("d = os.dup(1); os.dup2(d, 7); os.close(d)", "fd 7", "outside the tree"),
    "a device": ("os.open('/dev/tty0' if os.path.exists('/dev/tty0') else '/dev/kmsg', os.O_RDONLY)", "fd",
                 "a device"),
    "SysV shared memory in the host's IPC namespace": (
        f"{SHM}; i = c.shmget(0, 65536, 0o1600); c.shmat(i, None, 0); c.shmctl(i, 0, None)", "mapping",
        "host's IPC namespace"),
    "a SysV segment no process maps, in the tree's own IPC namespace": (
        f"{SHM}; c.shmget(4242, 65536, 0o1600)", "IPC namespace", "no process of the tree maps"),
    "a SysV semaphore set in the tree's own IPC namespace": (
        f"{SHM}; c.semget(4243, 1, 0o1600)", "IPC namespace", "semaphore sets"),
    "a process in a network namespace of its own": (
        f"{SHM}\nr, w = os.pipe()\nif os.fork() == 0:\n    c.unshare(0x40000000); os.write(w, b'x')\n"
        "    n = os.open('/dev/null', os.O_RDWR); os.dup2(n, 1); os.close(r); os.close(w)\n"
        "    while True: time.sleep(1)\nos.close(w); os.read(r, 1); os.close(r)", "pid 2",
        "a net namespace other than the tree's"),
    "a process in a pid namespace nested below the tree's": (
        f"{SHM}\nr, w = os.pipe()\nif os.fork() == 0:\n    c.unshare(0x20000000)\n    if os.fork() == 0:\n"
        "        os.write(w, b'x'); n = os.open('/dev/null', os.O_RDWR); os.dup2(n, 1); os.close(r); os.close(w)\n"
        "        while True: time.sleep(1)\n    n = os.open('/dev/null', os.O_RDWR); os.dup2(n, 1)\n"
        "    os.close(r); os.close(w)\n    while True: time.sleep(1)\nos.close(w); os.read(r, 1); os.close(r)",
        "pid 1", "a pid namespace other than the tree's"),
    "a process in an IPC namespace of its own": (
        f"{SHM}\nr, w = os.pipe()\nif os.fork() == 0:\n    c.unshare(0x08000000); os.write(w, b'x')\n"
        "    n = os.open('/dev/null', os.O_RDWR); os.dup2(n, 1); os.close(r); os.close(w)\n"
        "    while True: time.sleep(1)\nos.close(w); os.read(r, 1); os.close(r)", "pid 2",
        "an IPC namespace other than the tree's"),
    "a memfd mapped privately, written": (
        "import mmap; f = os.memfd_create('m'); os.ftruncate(f, 4096); "
        "m = mmap.mmap(f, 4096, flags=mmap.MAP_PRIVATE); m[0] = 1", "mapping", "holding pages of its own"),
    "a shared anonymous mapping": ("import mmap; m = mmap.mmap(-1, 8192, flags=mmap.MAP_SHARED); m[0] = 1", "mapping",
                                   "shared anonymous mapping"),
    "differing real and effective ids": ("os.setresuid(0, 65534, 0)", "pid 1", "real, effective and saved"),
    "a /proc file open in two processes": (
        "f = os.open('/proc/self/statm', os.O_RDONLY)\nif os.fork() == 0:\n"
        "    n = os.open('/dev/null', os.O_RDWR); os.dup2(n, 1)\n    while True: time.sleep(1)", "fd", "/proc file"),
    "a netlink socket with a reply in flight": (
        "import socket, struct; s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0); s.bind((0, 0)); "
        "s.send(struct.pack('=IHHII', 32, 18, 0x301, 1, 0) + bytes(16))", "fd", "messages in flight"),
    "an orphan in a session whose leader is alive, made after it": (
        "r, w = os.pipe()\nif os.fork() == 0:\n    if os.fork() == 0:\n        os.setsid()\n        b = os.fork()\n"
        "        if b == 0:\n            if os.fork() == 0:\n"
        "                n = os.open('/dev/null', os.O_RDWR); os.dup2(n, 1); os.write(w, b'x')\n"
        "                while True: time.sleep(1)\n            os._exit(0)\n        os.waitpid(b, 0)\n"
        "        n = os.open('/dev/null', os.O_RDWR); os.dup2(n, 1); os.close(r); os.close(w)\n"
        "        while True: time.sleep(1)\n"
        "    n = os.open('/dev/null', os.O_RDWR); os.dup2(n, 1); os.close(r); os.close(w)\n"
        "    while True: time.sleep(1)\nos.close(w); os.read(r, 1); os.close(r)", "pid 5",
        "its leader is alive, not made before it"),
    "an orphan in a session whose leader is its sibling with another exit signal": (
        "import ctypes\nr, w = os.pipe()\n"
        "if ctypes.CDLL(None).syscall(56, 10, 0, 0, 0, 0) == 0:  # clone(): exit signal SIGUSR1\n"
        "    os.setsid()\n    b = os.fork()\n    if b == 0:\n"
        "        if os.fork() == 0:\n            n = os.open('/dev/null', os.O_RDWR); os.dup2(n, 1); os.write(w, b'x')\n"
        "            while True: time.sleep(1)\n        os._exit(0)\n    os.waitpid(b, 0)\n"
        "    n = os.open('/dev/null', os.O_RDWR); os.dup2(n, 1); os.close(r); os.close(w)\n"
        "    while True: time.sleep(1)\nos.close(w); os.read(r, 1); os.close(r)", "pid 4",
        "its leader is alive with another parent or exit signal"),
}

# pid 2 leads a session; its grandchild (pid 4) is orphaned onto pid 1, pid 2's parent: a sibling of its leader
ADOPTED_ORPHAN = (
    "r, w = os.pipe()\nif os.fork() == 0:\n    os.setsid()\n    b = os.fork()\n    if b == 0:\n"
    "        if os.fork() == 0:\n            n = os.open('/dev/null', os.O_RDWR); os.dup2(n, 1); os.write(w, b'x')\n"
    "            while True: time.sleep(1)\n        os._exit(0)\n    os.waitpid(b, 0)\n"
    "    n = os.open('/dev/null', os.O_RDWR); os.dup2(n, 1); os.close(r); os.close(w)\n"
    "    while True: time.sleep(1)\nos.close(w); os.read(r, 1); os.close(r)")


OWN_IPC = {"a SysV segment no process maps, in the tree's own IPC namespace",
           "a SysV semaphore set in the tree's own IPC namespace"}


@pytest.fixture(scope="module")
def outside_listener() -> Iterator[None]:
    """A Unix listener outside any tree that accepts every connection (the refusal cases connect to it)."""
    accepted: list[socket.socket] = []
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind("\0bunshin-treefork-test")
        listener.listen(16)

        def accept() -> None:
            with contextlib.suppress(OSError):
                while True:
                    accepted.append(listener.accept()[0])

        threading.Thread(target=accept, daemon=True).start()
        yield
        listener.shutdown(socket.SHUT_RDWR)
    for conn in accepted:
        conn.close()


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_what_cannot_be_reproduced_is_refused_naming_it(tree: list[Tree], case: str, outside_listener: None) -> None:
    code, where, why = REFUSALS[case]
    t = python_tree(tree, code, keeps_pipe=1 if case == "a pipe to outside" else 0,
                    unshare=("--ipc",) if case in OWN_IPC else ())
    with pytest.raises(TreeForkRefused) as caught:
        read_tree(t.init, hostname="box")
    err = caught.value
    assert isinstance(err, ForkFailed)
    assert where in err.culprit and why in str(err), str(err)
    # a state the source leaves by itself is tried again by the engine; the rest is not
    assert err.transient == (case in ("a listener with a connection not yet accepted",
                                      "a datagram pair with a message in flight", "an inotify with events queued",
                                      "a netlink socket with a reply in flight",
                                      "a TCP connection its peer has closed")), case


def test_a_tree_whose_root_is_not_its_namespaces_pid_1_is_refused(tree: list[Tree]) -> None:
    t = python_tree(tree, "pid = os.fork()\nif pid == 0:\n    while True: time.sleep(1)")
    child = int(Path(f"/proc/{t.init}/task/{t.init}/children").read_text().split()[0])
    with pytest.raises(TreeForkRefused, match="not pid 1 of its pid namespace"):
        read_tree(child, hostname="box")


def test_a_zombie_is_planned_to_exit_again_with_its_status(tree: list[Tree]) -> None:
    t = python_tree(tree, "pid = os.fork()\nif pid == 0: os._exit(3)\n"
                    "os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)")  # a zombie now, not reaped
    plan = read_tree(t.init, hostname="box")
    [zombie] = [p for p in plan.processes if p.zombie]
    assert zombie.pid == 2 and zombie.ppid == 1 and zombie.exit_code == 3 << 8 and not zombie.descriptors
    assert "zombie 2 768 python3\n" in render(plan)


def test_unix_sockets_inside_the_tree_and_a_tcp_listener_are_planned(tree: list[Tree]) -> None:
    """A stream pair between pid 1 and its child with bytes in flight both ways, an abstract listener, a listener
    at a path, an unconnected socket and a TCP listener: each an object the builder makes again."""
    code = ("import socket\n"
            "a, b = socket.socketpair(); a.send(b'to b'); b.send(b'to a')\n"
            "l = socket.socket(socket.AF_UNIX); l.bind(f'\\0bunshin-tf-listen-{os.getppid()}'); l.listen(8)\n"
            "p = socket.socket(socket.AF_UNIX); p.bind(f'/tmp/bunshin-tf-{os.getppid()}.sock'); p.listen(8)\n"
            "u = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
            "t = socket.create_server(('127.0.0.1', 0))\n"
            "pid = os.fork()\n"
            "if pid == 0:\n    a.close(); n = os.open('/dev/null', os.O_RDWR); os.dup2(n, 1)\n"
            "    while True: time.sleep(1)\n"
            "b.close()")
    t = python_tree(tree, code)
    plan = read_tree(t.init, hostname="box")
    kinds = sorted(f.kind for f in plan.files)
    assert [k for k in kinds if k in ("socketpair", "socketpair_b", "unix_listen", "unix", "tcp_listen")] == \
        ["socketpair", "socketpair_b", "tcp_listen", "unix", "unix_listen", "unix_listen"]
    pair = next(f for f in plan.files if f.kind == "socketpair")
    other = next(f for f in plan.files if f.kind == "socketpair_b")
    assert other.peer == pair.oid and {pair.source_pid, other.source_pid} == {p.host_pid for p in plan.processes}
    names = {f.path for f in plan.files if f.kind == "unix_listen"}
    assert any(n.startswith("@bunshin-tf-listen-") for n in names) and any(n.startswith("/tmp/bunshin-tf-") for n in names)
    [tcp] = [f for f in plan.files if f.kind == "tcp_listen"]
    assert tcp.path == "127.0.0.1" and tcp.count > 0
    for f in plan.files:
        if f.kind == "unix_listen" and f.path.startswith("/tmp/"):
            os.unlink(f.path)


def test_a_session_whose_leader_is_gone_gets_a_placeholder_that_makes_its_orphans(tree: list[Tree]) -> None:
    """A daemon's double fork (Chromium's crashpad does it): the daemon is pid 1's child in a session numbered by
    the gone intermediate. The plan makes that session with a placeholder of that pid, made by pid 1 before it."""
    code = ("r, w = os.pipe()\npid = os.fork()\nif pid == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            "        os.close(r); n = os.open('/dev/null', os.O_RDWR); os.dup2(n, 1); os.write(w, b'x'); os.close(w)\n"
            "        while True: time.sleep(1)\n    os._exit(0)\n"
            "os.waitpid(pid, 0); os.close(w); os.read(r, 1); os.close(r)")
    t = python_tree(tree, code)
    plan = read_tree(t.init, hostname="box")
    assert [(p.pid, p.ppid, p.sid, p.placeholder, p.maker) for p in plan.processes] == \
        [(1, 0, 0, False, 0), (2, 1, 2, True, 0), (3, 1, 2, False, 2)]
    text = render(plan)
    assert "placeholder 2\n" in text and "maker 3 2\n" in text
    assert text.index("proc 2 0 1 2 2 17") < text.index("proc 3 ")


def test_a_pipe_end_closed_everywhere_is_planned_closed_and_its_bytes_in_flight_copied(tree: list[Tree]) -> None:
    """A pipe whose write end nobody holds any more (a child told to write its address there, its parent done
    reading: D-Bus's --print-address): the read end is planned with its bytes in flight, no write end; one held
    outside the tree is still refused ("a pipe to outside")."""
    t = python_tree(tree, "r, w = os.pipe(); os.write(w, b'left'); os.close(w)\nr2, w2 = os.pipe(); os.close(r2)")
    plan = read_tree(t.init, hostname="box")
    [reader, lone_writer] = [f for f in plan.files if f.kind == "pipe"]
    assert reader.source_pid == t.init and reader.source_where.startswith("fd/")
    assert lone_writer.source_pid == 0 and not lone_writer.source_where  # its read end closed: nothing to copy
    [writer] = [f for f in plan.files if f.kind == "pipe_w"]
    assert writer.peer == lone_writer.oid
    held = {d.oid for d in plan.processes[0].descriptors}
    assert reader.oid in held and writer.oid in held and lone_writer.oid not in held


def test_a_pidfd_of_a_process_of_the_tree_is_planned_for_its_holder_to_open_on_the_clones_process(
        tree: list[Tree]) -> None:
    """GLib's child watch holds a pidfd of its child (at-spi-bus-launcher of its bus): planned by the pid the
    process has in the tree's namespace (the clone's has the same), with PIDFD_NONBLOCK."""
    t = python_tree(tree, "c = os.fork()\nif c == 0:\n    n = os.open('/dev/null', os.O_RDWR); os.dup2(n, 1)\n"
                          "    while True: time.sleep(1)\np = os.pidfd_open(c, os.O_NONBLOCK); os.dup2(p, 9)")
    plan = read_tree(t.init, hostname="box")
    [pidfd] = [f for f in plan.files if f.kind == "pidfd"]
    assert pidfd.count == 2 and pidfd.flags == os.O_NONBLOCK
    assert {d.num for d in plan.processes[0].descriptors if d.oid == pidfd.oid} >= {9}
    assert f"obj {pidfd.oid} pidfd 2 {os.O_NONBLOCK}\n" in render(plan)
    assert describe(t.init)[1]["fds"][9][3] == ("pidfd", "2")


PIDFD_REFUSALS = {
    "of a process outside the tree": ("os.dup2(OUTSIDE, 9)", "a pidfd of a process outside the tree"),
    "of a process that is gone": ("c = os.fork()\nif c == 0: os._exit(0)\np = os.pidfd_open(c); os.waitpid(c, 0)",
                                  "a pidfd of a process that is gone"),
    "open in two processes": ("p = os.pidfd_open(os.getpid())\nif os.fork() == 0:\n"
                              "    n = os.open('/dev/null', os.O_RDWR); os.dup2(n, 1)\n    while True: time.sleep(1)",
                              "a pidfd open in two processes"),
}


@pytest.mark.parametrize("case", sorted(PIDFD_REFUSALS))
def test_a_pidfd_that_cannot_be_reproduced_is_refused(tree: list[Tree], case: str) -> None:
    code, why = PIDFD_REFUSALS[case]
    outside = os.pidfd_open(os.getpid())  # ours: a process outside every tree
    try:
        t = python_tree(tree, code.replace("OUTSIDE", str(outside)), pass_fds=(outside,))
    finally:
        os.close(outside)
    with pytest.raises(TreeForkRefused, match=why):
        read_tree(t.init, hostname="box")


def test_a_connection_whose_peer_closed_is_one_end_of_a_pair_with_what_was_sent_to_it(tree: list[Tree]) -> None:
    """A client a server dropped (it accepted, sent, closed; its listener is gone too): the client's end is planned
    as a pair's end whose other end no process has (the builder closes it), its bytes in flight copied."""
    t = python_tree(tree, "import socket\nl = socket.socket(socket.AF_UNIX); l.bind('\\0bunshin-tf-gone'); l.listen(1)\n"
                          "c = socket.socket(socket.AF_UNIX); c.connect('\\0bunshin-tf-gone')\n"
                          "a, _ = l.accept(); a.send(b'bye'); a.close(); l.close()")
    plan = read_tree(t.init, hostname="box")
    [end] = [f for f in plan.files if f.kind == "socketpair"]
    assert not [f for f in plan.files if f.kind in ("socketpair_b", "accepted", "unix_listen")]
    assert end.source_pid == t.init and end.source_where.startswith("fd/") and end.count == socket.SOCK_STREAM
    assert end.oid in {d.oid for d in plan.processes[0].descriptors}


def test_an_orphan_its_parent_adopted_is_made_by_its_sessions_living_leader(tree: list[Tree]) -> None:
    """D-Bus's activated services: a session member whose parent died, adopted by pid 1, the parent of the
    session's leader too: the leader makes it (``CLONE_PARENT``), so it is pid 1's child in that session."""
    t = python_tree(tree, ADOPTED_ORPHAN)
    plan = read_tree(t.init, hostname="box")
    procs = {p.pid: p for p in plan.processes}
    assert (procs[4].ppid, procs[4].sid, procs[4].maker) == (1, 2, 2) and not procs[2].placeholder
    assert [p.pid for p in plan.processes].index(2) < [p.pid for p in plan.processes].index(4)
    assert "maker 4 2\n" in render(plan)


def test_a_netlink_socket_is_planned_with_its_protocol_port_and_groups(tree: list[Tree]) -> None:
    t = python_tree(tree, "import socket\ns = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0); s.bind((0, 1))")
    plan = read_tree(t.init, hostname="box")
    [nl] = [f for f in plan.files if f.kind == "netlink"]
    assert (nl.count, nl.protocol, nl.groups) == (socket.SOCK_RAW, 0, 1) and nl.port != 0
    assert f"obj {nl.oid} netlink {int(socket.SOCK_RAW)} 0 {nl.port} 1\n" in render(plan)


def test_an_inotify_instance_is_planned_with_its_watches_numbers_masks_and_paths(tree: list[Tree],
                                                                                 tmp_path: Path) -> None:
    """Watch 2 removed, so the clone must skip a number: the plan keeps the source's numbers (1 and 3)."""
    (tmp_path / "b").mkdir()
    code = (f"import ctypes\nc = ctypes.CDLL(None); i = c.inotify_init1(0o4000)\n"
            f"c.inotify_add_watch(i, b'{tmp_path}', 0x100)\nw = c.inotify_add_watch(i, b'/etc', 0x2)\n"
            f"c.inotify_rm_watch(i, w)\nc.inotify_add_watch(i, b'{tmp_path}/b', 0x200)\n"
            "os.read(i, 4096)")  # the removal's IN_IGNORED, read away
    t = python_tree(tree, code)
    plan = read_tree(t.init, hostname="box")
    [ino] = [f for f in plan.files if f.kind == "inotify"]
    assert [(w.wd, w.mask, w.path) for w in ino.watches] == [(1, 0x100, str(tmp_path)), (3, 0x200, f"{tmp_path}/b")]
    assert ino.flags == os.O_NONBLOCK
    text = render(plan)
    assert f"obj {ino.oid} inotify\ninotify_watch {ino.oid} 1 256 {tmp_path}\ninotify_watch {ino.oid} 3 512 " \
           f"{tmp_path}/b\n" in text


def test_a_deleted_file_and_shared_file_mappings_are_copies_of_their_own(tree: list[Tree], tmp_path: Path) -> None:
    """A deleted file open and mapped shared is a ghost, made again at its path and unlinked; a file on a writable
    mount mapped shared is moved onto the clone's file at its path; a read-only descriptor of a memfd is the copy
    opened again read-only (one copy of the memfd for every descriptor and mapping of it)."""
    code = ("import mmap\n"
            f"g = os.open('{tmp_path}/ghost', os.O_RDWR | os.O_CREAT); os.ftruncate(g, 8192); os.lseek(g, 100, 0)\n"
            "gm = mmap.mmap(g, 8192); gm[0] = 7\n"
            f"os.unlink('{tmp_path}/ghost')\n"
            f"f = os.open('{tmp_path}/shared', os.O_RDWR | os.O_CREAT); os.ftruncate(f, 4096)\n"
            "fm = mmap.mmap(f, 4096); os.close(f)\n"
            "m = os.memfd_create('region'); os.ftruncate(m, 4096)\n"
            "r = os.open(f'/proc/self/fd/{m}', os.O_RDONLY); mm = mmap.mmap(m, 4096)")
    t = python_tree(tree, code)
    plan = read_tree(t.init, hostname="box")
    [proc] = plan.processes
    by_oid = {f.oid: f for f in plan.files}
    [ghost] = [f for f in plan.files if f.kind == "shm"]
    assert ghost.path == f"{tmp_path}/ghost" and ghost.count == 1 and ghost.offset == 100  # unlinked again
    # (Python's mmap keeps a descriptor of its own of the file too: another object)
    [shared] = [by_oid[r.oid] for r in proc.remaps if by_oid[r.oid].path == f"{tmp_path}/shared"]
    assert shared.kind == "file" and shared.flags == os.O_RDWR
    [memfd] = [f for f in plan.files if f.kind == "memfd"]
    [reopen] = [f for f in plan.files if f.kind == "reopen"]
    assert reopen.peer == memfd.oid and reopen.flags & os.O_ACCMODE == os.O_RDONLY
    assert {by_oid[r.oid].kind for r in proc.remaps} == {"shm", "file", "memfd"}
    assert {r.oid for r in proc.remaps} == {ghost.oid, shared.oid, memfd.oid}, [(r, by_oid[r.oid]) for r in proc.remaps]
    assert f"obj {reopen.oid} reopen {memfd.oid} 0 0\n" in render(plan)


def test_sysv_segments_of_the_trees_own_ipc_namespace_are_planned_once_with_id_key_mode_size_and_owner(
        tree: list[Tree]) -> None:
    """X's MIT-SHM, in short: a keyed segment and a removed private one (IPC_RMID while attached, as X clients
    do), each mapped by two processes (a fork inherits the attaches): one object each, with the kernel's id, key,
    size, mode (``SHM_DEST`` for the removed one) and owner, taken from a mapping; every mapping moves onto it."""
    code = (f"{SHM}\n"
            "k = c.shmget(0x5151, 3 * 4096, 0o1640 | 0o1000); a = c.shmat(k, None, 0); ctypes.memset(a, 7, 4096)\n"
            "p = c.shmget(0, 1 << 20, 0o1600); b = c.shmat(p, None, 0); c.shmctl(p, 0, None)\n"
            "if os.fork() == 0:\n    n = os.open('/dev/null', os.O_RDWR); os.dup2(n, 1)\n"
            "    while True: time.sleep(1)")
    t = python_tree(tree, code, unshare=("--ipc",))
    plan = read_tree(t.init, hostname="box")
    segments = sorted((f for f in plan.files if f.kind == "sysv"), key=lambda f: f.segment.key if f.segment else 0)
    assert [s.segment.key if s.segment else None for s in segments] == [0, 0x5151], segments
    removed, keyed = (s.segment for s in segments)
    assert removed is not None and keyed is not None
    assert removed.removed and removed.size == 1 << 20 and removed.mode & 0o777 == 0o600
    assert not keyed.removed and keyed.size == 3 * 4096 and keyed.mode & 0o777 == 0o640
    assert keyed.uid == 0 and keyed.nattch == 2 and removed.nattch == 2
    for proc in plan.processes:
        assert sorted(r.oid for r in proc.remaps if r.oid in {s.oid for s in segments}) == \
            sorted(s.oid for s in segments), proc
    k = segments[1]
    assert k.source_where.startswith("map_files/")
    assert f"obj {k.oid} sysv {keyed.shmid} {0x5151} {keyed.mode} {3 * 4096} 0 0 {k.source_pid} " \
           f"{k.source_where}\n" in render(plan)


def test_the_oracle_lists_the_trees_sysv_segments_and_hashes_their_data_without_filling_their_holes(
        tree: list[Tree]) -> None:
    """A 64 MiB segment holding 10 bytes: the oracle's description lists it (key, size, attaches) and hashes its
    pages with data only, read from its file: the segment still holds one page after; the hash follows the data."""
    code = f"{SHM}\nk = c.shmget(0x77, 64 << 20, 0o1600); a = c.shmat(k, None, 0); ctypes.memset(a + 5 * 4096, 9, 10)"
    t = python_tree(tree, code, unshare=("--ipc",))

    def resident() -> int:  # the segment's rss, as its IPC namespace lists it
        text = in_namespace_of(t.init, "ipc", syscalls.CLONE_NEWIPC, Path("/proc/sysvipc/shm").read_text, 10)
        return int(text.splitlines()[1].split()[14])

    view = describe(t.init)
    segments, semaphores, queues = view[1]["ipc"]  # type: ignore[misc]
    assert [(g.key, g.size, g.nattch) for g in segments] == [(0x77, 64 << 20, 1)] and not semaphores and not queues
    maps: list[tuple[str, str, str, str, str]] = view[1]["maps"]  # type: ignore[assignment]
    [where] = [f"{start}-{end}" for start, end, _, _, name in maps if name.startswith("/SYSV")]
    assert resident() == 4096, "describing the segment filled its holes"
    first = view[1]["memory"][where]  # type: ignore[index]
    assert describe(t.init)[1]["memory"][where] == first  # type: ignore[index]
    os.kill(t.init, signal.SIGCONT)
    with open(f"/proc/{t.init}/mem", "r+b", buffering=0) as mem:
        mem.seek(int(where.split("-")[0], 16) + 5 * 4096 + 3)
        mem.write(b"\x01")
    os.kill(t.init, signal.SIGSTOP)
    assert describe(t.init)[1]["memory"][where] != first


def test_an_inherited_descriptor_is_the_callers_in_place_of_the_sources_open_file(
        tree: list[Tree], outside_listener: None) -> None:
    """A connection to outside the tree (an engine's channel, say), which alone would refuse the fork: named in
    ``inherit``, it is planned as the caller's descriptor, for every descriptor of that open file (a child's
    inherited copy too); nothing else changes. A name the tree lacks, or one open file given two descriptors,
    is the caller's mistake: ValueError."""
    code = ("import socket; c = socket.socket(socket.AF_UNIX); c.connect('\\0bunshin-treefork-test'); "
            "os.dup2(c.fileno(), 7)\nif os.fork() == 0:\n    n = os.open('/dev/null', os.O_RDWR); os.dup2(n, 1)\n"
            "    while True: time.sleep(1)")
    t = python_tree(tree, code)
    with pytest.raises(TreeForkRefused):
        read_tree(t.init, hostname="box")
    plan = read_tree(t.init, hostname="box", inherit={(1, 7): 9})
    [inherited] = [f for f in plan.files if f.kind == "inherit"]
    assert inherited.count == 9
    for proc in plan.processes:  # fd 7 and the socket's own descriptor, in both processes
        assert [d.num for d in proc.descriptors if d.oid == inherited.oid] == sorted(
            [7, next(d.num for d in proc.descriptors if d.oid == inherited.oid and d.num != 7)]), proc.descriptors
    assert f"obj {inherited.oid} inherit 9\n" in render(plan)
    with pytest.raises(ValueError, match="does not have"):
        read_tree(t.init, hostname="box", inherit={(1, 7): 9, (1, 99): 10})
    socket_fd = next(d.num for d in plan.processes[0].descriptors if d.oid == inherited.oid and d.num != 7)
    with pytest.raises(ValueError, match="two descriptors"):
        read_tree(t.init, hostname="box", inherit={(1, 7): 9, (1, socket_fd): 10})


def test_a_proc_file_is_planned_for_its_process_to_open_in_the_clones_proc(tree: list[Tree]) -> None:
    t = python_tree(tree, "f = os.open('/proc/self/statm', os.O_RDONLY); os.read(f, 3)")
    plan = read_tree(t.init, hostname="box")
    [proc] = [f for f in plan.files if f.kind == "proc"]
    assert proc.path == "/proc/1/statm" and proc.offset == 3 and proc.flags & os.O_ACCMODE == os.O_RDONLY
    assert f"obj {proc.oid} proc {proc.flags} 3 /proc/1/statm\n" in render(plan)


def test_an_inotify_watch_on_a_file_system_without_file_handles_is_found_by_its_inode(
        tree: list[Tree], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As on the VM's 9p: the handles do not open, the watched inodes are searched for, in every mount of their file
    system together (the paths are the same as through the handles), a bounded search whose findings are kept."""
    from bunshin.envs.runtime.treefork import inotify

    def no_handles(*_: object) -> int:
        raise OSError(95, "Operation not supported")

    (tmp_path / "b" / "c").mkdir(parents=True)
    code = (f"import ctypes\nc = ctypes.CDLL(None); i = c.inotify_init1(0o4000)\n"
            f"c.inotify_add_watch(i, b'{tmp_path}/b/c', 0x100)\nc.inotify_add_watch(i, b'{tmp_path}', 0x200)\n")
    t = python_tree(tree, code)
    monkeypatch.setattr(inotify.syscalls, "open_by_handle_at", no_handles)
    plan = read_tree(t.init, hostname="box")
    [ino] = [f for f in plan.files if f.kind == "inotify"]
    assert [(w.wd, w.path) for w in ino.watches] == [(1, f"{tmp_path}/b/c"), (2, str(tmp_path))]
    monkeypatch.setattr(inotify, "SEARCH_DIRS", 1)  # bounded: one directory read finds neither...
    again = read_tree(t.init, hostname="box")  # ...but what was found is known while it names the same inodes
    assert [w.path for f in again.files for w in f.watches] == [w.path for w in ino.watches]
    monkeypatch.setattr(inotify, "_FOUND", {})
    with pytest.raises(TreeForkRefused, match=r"watch \d names a file no mount of the tree reaches"):
        read_tree(t.init, hostname="box")


def test_rlimits_read_from_proc_equal_prlimits() -> None:
    """Another user's process without CAP_SYS_RESOURCE here: its limits come from /proc/PID/limits, the same."""
    from bunshin.envs.runtime.treefork.reader import _rlimits, _rlimits_from_proc

    assert _rlimits_from_proc(os.getpid()) == _rlimits(os.getpid())
    assert len(_rlimits_from_proc(os.getpid())) == 16


# a devpts instance of the tree's own at /dev/pts (the tree has a mount namespace of its own), as a workspace has
DEVPTS = ("import ctypes, fcntl, pty, signal, struct, termios\n"
          "assert ctypes.CDLL(None).mount(b'devpts', b'/dev/pts', b'devpts', 0, b'newinstance,ptmxmode=0666') == 0\n")
# a terminal: pid 1 holds the master (window 33x101, no echo); pid 2 (a session's leader, the pty its controlling
# terminal) holds the slave as 0, 1, 2; pid 3, a process group of its own, is the terminal's foreground group
TERMINAL = DEVPTS + (
    "pid, master = pty.fork()\nif pid == 0:\n    signal.signal(signal.SIGTTOU, signal.SIG_IGN)\n"
    "    if os.fork() == 0:\n        os.setpgid(0, 0); os.tcsetpgrp(0, os.getpgrp())\n"
    "        while True: time.sleep(1)\n    while True: time.sleep(1)\n"
    "fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack('HHHH', 33, 101, 0, 0))\n"
    "a = termios.tcgetattr(master); a[3] &= ~termios.ECHO; termios.tcsetattr(master, termios.TCSANOW, a)\n"
    # until pid 3's group is the foreground: 0 before the child took the terminal, its own group until pid 3 took it
    "while os.tcgetpgrp(master) in (0, pid): time.sleep(0.01)\n")


def test_a_terminal_is_planned_with_its_index_termios_window_controlling_session_and_foreground_group(
        tree: list[Tree]) -> None:
    import termios

    t = python_tree(tree, TERMINAL)
    plan = read_tree(t.init, hostname="box")
    [master] = [f for f in plan.files if f.kind == "ptmx"]
    [slave] = [f for f in plan.files if f.kind == "pts"]
    assert master.terminal is not None and master.terminal.index == 0 and master.path == "/dev/ptmx"
    assert slave.path == "/dev/pts/0" and slave.peer == master.oid and slave.flags & os.O_ACCMODE == os.O_RDWR
    assert struct.unpack("HHHH", master.terminal.winsize)[:2] == (33, 101)
    assert not struct.unpack("4I", master.terminal.termios[:16])[3] & termios.ECHO
    procs = {p.pid: p for p in plan.processes}
    assert (procs[1].ctty, procs[2].ctty, procs[3].ctty) == (-1, slave.oid, -1)
    assert (procs[1].foreground, procs[2].foreground, procs[3].foreground) == (-1, -1, slave.oid)
    assert [d.num for d in procs[2].descriptors if d.oid == slave.oid] == [0, 1, 2]
    text = render(plan)
    assert f"ctty 2 {slave.oid}\n" in text and f"foreground 3 {slave.oid}\n" in text
    assert f"obj {slave.oid} pts {master.oid} {slave.flags} /dev/pts/0\n" in text
    assert (f"obj {master.oid} ptmx {master.flags} 0 0 {master.terminal.termios.hex()} "
            f"{master.terminal.winsize.hex()} /dev/ptmx\n") in text
    view = describe(t.init)
    assert view[2]["tty"] == ((136, 0), 3) and view[3]["tty"] == ((136, 0), 3) and "tty" not in view[1]
    [master_fd] = [d.num for d in procs[1].descriptors if d.oid == master.oid]
    assert view[1]["fds"][master_fd][3][:2] == ("ptmx", 0) and view[2]["fds"][0][3] == ("pts", 0)


PTY_REFUSALS = {
    "a pty with bytes in flight": (
        DEVPTS + "pid, master = pty.fork()\nif pid == 0:\n    while True: time.sleep(1)\nos.write(master, b'typed')",
        "pid 1 fd", "bytes in flight"),
    "a pty whose master is outside the tree": (
        DEVPTS + "m, s = pty.openpty(); os.close(m)", "pid 1 fd", "master is outside the tree"),
    "a pty of another devpts instance": (
        "import pty; m, s = pty.openpty()\n" + DEVPTS, "pid 1 fd", "devpts instance other than the tree's"),
    "a pty slave opened twice": (
        DEVPTS + "m, s = pty.openpty(); s2 = os.open(os.ttyname(s), os.O_RDWR | os.O_NOCTTY)", "pid 1 fd",
        "opened twice"),
    "a pty master still locked": (
        DEVPTS + "m = os.open('/dev/ptmx', os.O_RDWR | os.O_NOCTTY)", "pid 1 fd", "still locked"),
    "a controlling terminal that is not a pty of the tree": (
        DEVPTS + "r, w = os.pipe()\nif os.fork() == 0:\n    os.close(r); os.setsid(); fcntl.ioctl(HOST_PTY, termios.TIOCSCTTY, 0)\n"
        "    os.close(HOST_PTY); n = os.open('/dev/null', os.O_RDWR); os.dup2(n, 1); os.close(w)\n"
        "    while True: time.sleep(1)\n"
        "os.close(w); os.close(HOST_PTY); os.read(r, 1); os.close(r)",  # EOF once pid 2 took the terminal
        "pid 2", "not a pty of the tree"),
}


@pytest.mark.parametrize("case", sorted(PTY_REFUSALS))
def test_a_terminal_that_cannot_be_reproduced_is_refused_naming_it(tree: list[Tree], case: str) -> None:
    import pty

    code, where, why = PTY_REFUSALS[case]
    outside_master, outside_slave = pty.openpty()  # the host's: a terminal a session of the tree takes (HOST_PTY)
    try:
        t = python_tree(tree, code.replace("HOST_PTY", str(outside_slave)), pass_fds=(outside_slave,))
    finally:
        os.close(outside_slave)
    try:
        with pytest.raises(TreeForkRefused) as caught:
            read_tree(t.init, hostname="box")
        assert where in caught.value.culprit and why in str(caught.value), str(caught.value)
        # bytes in flight are a state a running tree leaves by itself: the engine tries such a fork again
        assert caught.value.transient == (case == "a pty with bytes in flight")
    finally:
        os.close(outside_master)

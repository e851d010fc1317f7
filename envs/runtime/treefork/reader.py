"""Reading a frozen process tree from /proc into a ``TreePlan``: its processes (pids, parents, sessions, process
groups, credentials, cwd, rlimits, exit signals; zombies), threads, open files (which descriptors, in which processes,
are one open file: ``kcmp``), pipes and their bytes in flight, eventfds, epolls and their interest lists, ptys and
controlling terminals (``terminals.py``), Unix sockets (``sockets.py``), TCP listeners and netlink sockets, shared
memory (memfd, /dev/shm) and the mappings of it the clone must take from its own copy; a placeholder for each
session whose leader is gone.

Owns: ``read_tree`` and the refusals: anything the builder cannot reproduce faithfully raises ``TreeForkRefused``
naming the process, the descriptor or mapping and what it is. Never a silently different clone.
Must never: write to the source, or read it while it runs (the caller froze it).
"""

from __future__ import annotations

import fcntl
import os
import re
import resource
import socket
import stat
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .. import syscalls
from ..syscalls import same_open_file
from . import terminals
from .errors import TreeForkRefused
from .inotify import inotify_watches, queued_bytes
from .plan import SOCKET_PASSCRED, Descriptor, OpenFile, ProcessPlan, Remap, TreePlan, Watch
from .procfs import MAPS, cgroup_below, inside, last, status, walk
from .sockets import ESTABLISHED, LISTEN, NetlinkSocket, netlink_sockets, unix_sockets
from .sysv import Ipc, read_ipc

RLIM_INFINITY = (1 << 64) - 1
# the character devices a clone reopens (in its own /dev), by device number: they hold no state
STATELESS_DEVICES = {(1, 3): "/dev/null", (1, 5): "/dev/zero", (1, 7): "/dev/full", (1, 8): "/dev/random",
                     (1, 9): "/dev/urandom"}
STATUS_FLAGS = os.O_APPEND | os.O_NONBLOCK | os.O_DIRECT | os.O_NOATIME | 0o20000  # O_ASYNC
UNSUPPORTED_ANON = {"[timerfd]": "a timerfd", "[signalfd]": "a signalfd",
                    "[io_uring]": "an io_uring", "[fanotify]": "a fanotify group",
                    "[userfaultfd]": "a userfaultfd", "bpf-map": "a BPF map", "bpf-prog": "a BPF program",
                    "[perf_event]": "a perf event"}


@dataclass
class _Fd:
    """One descriptor of one source process, as /proc shows it."""

    host_pid: int
    pid: int
    num: int
    link: str
    flags: int
    pos: int
    info: str
    oid: int = -1

    @property
    def culprit(self) -> str:
        return f"pid {self.pid} fd {self.num} ({self.link})"


@dataclass
class _Reading:
    root: str  # the source's root directory, as we see it ("" when it is ours)
    files: list[OpenFile] = field(default_factory=list)
    watches: list[Watch] = field(default_factory=list)
    by_inode: dict[tuple[int, int], int] = field(default_factory=dict)  # shared memory copies, by (dev, inode)
    copies_in_use: set[int] = field(default_factory=set)  # copies already an open file of some descriptor
    mapped_files: dict[tuple[int, int], int] = field(default_factory=dict)  # files a mapping moves onto
    segments: dict[int, int] = field(default_factory=dict)  # SysV segments' copies, by id
    tree: dict[int, int] = field(default_factory=dict)  # the tree's processes: pid in its namespace, by host pid
    masters: dict[int, int] = field(default_factory=dict)  # pty masters, by index
    slaves: dict[int, int] = field(default_factory=dict)  # pty slaves, by index (one open file each)
    _ipc: Ipc | None = None

    def ipc(self, host_pid: int) -> Ipc:
        """The SysV objects of the tree's IPC namespace (read once: a tree has one, checked at the end)."""
        if self._ipc is None:
            self._ipc = read_ipc(host_pid)
        return self._ipc

    def add(self, **kwargs: object) -> int:
        oid = len(self.files)
        self.files.append(OpenFile(oid=oid, **kwargs))  # type: ignore[arg-type]
        return oid


def _fdinfo(host_pid: int, num: int) -> tuple[int, int, str]:
    text = Path(f"/proc/{host_pid}/fdinfo/{num}").read_text()
    pos = int(re.search(r"^pos:\s+(\d+)", text, re.M).group(1))  # type: ignore[union-attr]
    flags = int(re.search(r"^flags:\s+([0-7]+)", text, re.M).group(1), 8)  # type: ignore[union-attr]
    return pos, flags, text


def _read_fds(host_pid: int, pid: int) -> list[_Fd]:
    out = []
    base = f"/proc/{host_pid}/fd"
    for name in sorted(os.listdir(base), key=int):
        num = int(name)
        try:
            link = os.readlink(f"{base}/{num}")
            pos, flags, info = _fdinfo(host_pid, num)
        except FileNotFoundError:
            continue
        out.append(_Fd(host_pid, pid, num, link, flags, pos, info))
    return out


def _group_open_files(fds: list[_Fd]) -> list[list[_Fd]]:
    """Descriptors grouped by open file (kcmp), compared only among those that could be one (same target)."""
    groups: list[list[_Fd]] = []
    by_link: dict[str, list[list[_Fd]]] = {}
    for fd in fds:
        for group in by_link.setdefault(fd.link, []):
            head = group[0]
            if same_open_file(head.host_pid, head.num, fd.host_pid, fd.num):
                group.append(fd)
                break
        else:
            by_link[fd.link].append([fd])
            groups.append(by_link[fd.link][-1])
    return groups


def _pipe_objects(reading: _Reading, groups: list[list[_Fd]]) -> None:
    """Pipes: one new pipe per source pipe, its bytes in flight copied from the source's read end; an end no
    process has (closed: not held outside the tree either) is made and closed in the clone too."""
    pipes: dict[str, dict[str, list[_Fd]]] = {}
    for group in groups:
        head = group[0]
        if head.link.startswith("pipe:"):
            end = "r" if head.flags & os.O_ACCMODE == os.O_RDONLY else "w"
            ends = pipes.setdefault(head.link, {})
            if end in ends:
                raise TreeForkRefused(head.culprit, "a pipe end opened twice (two open files of one end)")
            ends[end] = group
    tree = {fd.host_pid for group in groups for fd in group}
    for link, ends in pipes.items():
        if set(ends) != {"r", "w"}:
            some = next(iter(ends.values()))[0]
            missing = "read" if "r" not in ends else "write"
            if _held_outside(link, tree):
                raise TreeForkRefused(some.culprit, f"the pipe's {missing} end is outside the tree")
            # closed everywhere (a child given a pipe to write its address to, its parent done reading): the
            # clone's is made and closed too (the builder closes what no clone process has)
        reader = ends.get("r", ends.get("w"))[0]  # type: ignore[index]
        rid = reading.add(kind="pipe", flags=reader.flags & STATUS_FLAGS if "r" in ends else 0,
                          pipe_size=_pipe_size(reader), source_pid=reader.host_pid if "r" in ends else 0,
                          source_where=f"fd/{reader.num}" if "r" in ends else "")
        for fd in ends.get("r", []):
            fd.oid = rid
        if "w" in ends:
            wid = reading.add(kind="pipe_w", flags=ends["w"][0].flags & STATUS_FLAGS, peer=rid)
            for fd in ends["w"]:
                fd.oid = wid


def _held_outside(link: str, tree: set[int]) -> bool:
    """Whether a process outside the tree (``tree``: its host pids) has a descriptor of ``link`` ("pipe:[N]"):
    every process's descriptors are looked at (only when a pipe's end is missing from the tree)."""
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in tree:
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:  # gone, or not ours to read
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{name}/fd/{fd}") == link:
                    return True
            except OSError:
                continue
    return False


def _terminal_objects(reading: _Reading, groups: list[list[_Fd]], init_host_pid: int) -> None:
    """Ptys of the tree's own devpts instance: a master is made again at the same index with its slave's termios,
    window size and packet mode (nothing may be in flight either way), a slave is opened again at its path; a
    slave whose master is outside the tree, a pty of another devpts instance (the host's), or a slave opened twice
    (two open files of one end) is refused."""
    devpts: int | None = None
    masters, slaves = [], []
    for group in groups:
        head = group[0]
        if head.oid >= 0 or not head.link.startswith("/"):  # a path (as we see it: the tree's root before it)
            continue
        st = os.stat(f"/proc/{head.host_pid}/fd/{head.num}")
        if not stat.S_ISCHR(st.st_mode):
            continue
        if terminals.is_master(st):
            masters.append(group)
        elif (index := terminals.slave_index(st.st_rdev)) is not None:
            slaves.append((group, index, st.st_dev))
    if masters or slaves:
        devpts = terminals.devpts_of(init_host_pid)
    for group in masters:
        head = group[0]
        master = terminals.read_master(head.host_pid, head.num, head.culprit)
        if master.devpts != devpts:
            raise TreeForkRefused(head.culprit, "a pty master of a devpts instance other than the tree's /dev/pts")
        if master.queued_out or master.queued_in:
            raise TreeForkRefused(head.culprit, f"a pty with bytes in flight ({master.queued_out} to its master, "
                                                f"{master.queued_in} to its slave)")
        oid = reading.add(kind="ptmx", path=inside(head.link, reading.root, head.culprit),
                          flags=head.flags & ~os.O_CLOEXEC, terminal=master.terminal)
        reading.masters[master.terminal.index] = oid
        for fd in group:
            fd.oid = oid
    for group, index, dev in slaves:
        head = group[0]
        if dev != devpts:
            raise TreeForkRefused(head.culprit, "a pty of a devpts instance other than the tree's /dev/pts")
        if index not in reading.masters:
            raise TreeForkRefused(head.culprit, "a pty whose master is outside the tree")
        if index in reading.slaves:
            raise TreeForkRefused(head.culprit, "a pty slave opened twice (two open files of it)")
        oid = reading.slaves[index] = reading.add(kind="pts", path=f"/dev/pts/{index}", peer=reading.masters[index],
                                                  flags=head.flags & ~os.O_CLOEXEC)
        for fd in group:
            fd.oid = oid


def _controlling_terminals(reading: _Reading, processes: list[ProcessPlan], ttys: dict[int, tuple[int, int]],
                           ns_of: dict[int, int]) -> None:
    """Each session of the tree with a controlling terminal: its leader takes the clone's pty of the same index
    (``ctty``), and the terminal's foreground process group's leader makes its group the foreground one again
    (``foreground``). ``ttys``: each process's ``tty_nr`` and ``tpgid`` (host pids). A session led from outside the
    tree's pid namespace keeps the builder's (as its number does); any other controlling terminal that is not a pty
    of the tree is refused, as is a process whose controlling terminal is not its session's."""
    by_pid = {p.pid: p for p in processes}
    for p in processes:
        if p.zombie or p.placeholder or p.sid == 0 or p.host_pid not in ttys:
            continue
        tty_nr, tpgid = ttys[p.host_pid]
        leader = by_pid.get(p.sid)
        culprit = f"pid {p.pid} ({p.comm})"
        if leader is not None and leader.host_pid in ttys and ttys[leader.host_pid][0] != tty_nr:
            raise TreeForkRefused(culprit, "a controlling terminal other than its session leader's")
        if not tty_nr:
            continue
        major, minor = terminals.controlling_tty(tty_nr)
        index = terminals.slave_index(os.makedev(major, minor))
        if leader is None or leader.placeholder:
            raise TreeForkRefused(culprit, f"a controlling terminal ({major}:{minor}) in session {p.sid}, whose "
                                           "leader is gone")
        if index is None or index not in reading.masters:
            raise TreeForkRefused(culprit, f"a controlling terminal ({major}:{minor}) that is not a pty of the tree")
        if index not in reading.slaves:  # nobody holds it open: made for its leader to take
            reading.slaves[index] = reading.add(kind="pts", path=f"/dev/pts/{index}", peer=reading.masters[index],
                                                flags=os.O_RDWR)
        leader.ctty = reading.slaves[index]
        if tpgid > 0 and ns_of.get(tpgid) != p.sid:
            group = by_pid.get(ns_of.get(tpgid, 0))
            if group is None or group.pgid != group.pid or group.sid != p.sid:
                raise TreeForkRefused(culprit, f"its terminal's foreground process group (host pid {tpgid}) is not "
                                               "led from inside its session")
            group.foreground = reading.slaves[index]


def _socket_objects(reading: _Reading, groups: list[list[_Fd]], init_host_pid: int) -> None:
    """Unix sockets: a connected pair inside the tree becomes a new socket pair (a stream's bytes in flight copied
    into it, each way), a listener listens again at its name, an unconnected socket is made again (bound if it
    was), a connected one whose peer closed is one end of a pair whose other end is closed (what was sent to it
    first, then EOF: a peer that closed with bytes unread gave the source ECONNRESET once, which is not read:
    reading it would clear it). A TCP listener listens again at its address (in the clone's own network namespace). Anything else that
    crosses the tree's boundary is refused."""
    socket_groups = {int(g[0].link[8:-1]): g for g in groups if g[0].link.startswith("socket:[")}
    if not socket_groups:
        return
    diag = unix_sockets(init_host_pid)
    netlink = netlink_sockets(init_host_pid)
    # listeners first, then named ends of connections (accepted ones), then the rest
    order = sorted(socket_groups, key=lambda i: (0 if i in diag and diag[i].state == LISTEN else
                                                 1 if i in diag and diag[i].name else 2))
    for inode in order:
        group = socket_groups[inode]
        head = group[0]
        if group[0].oid >= 0:
            continue
        unix = diag.get(inode)
        if unix is None:
            _other_socket(reading, group, netlink)
            continue
        if unix.state == LISTEN:
            if unix.pending:
                raise TreeForkRefused(head.culprit, f"a listener with {len(unix.pending)} connections not yet "
                                                    "accepted")
            oid = reading.add(kind="unix_listen", path=unix.name, count=unix.type,
                              flags=head.flags & STATUS_FLAGS)
        elif unix.peer:
            peer = socket_groups.get(unix.peer)
            if peer is None:
                raise TreeForkRefused(head.culprit, f"a {unix.kind} socket connected outside the tree")
            if unix.type != socket.SOCK_STREAM and (unix.queued or diag[unix.peer].queued):
                raise TreeForkRefused(head.culprit, f"a {unix.kind} socket pair with messages in flight")
            other = diag[unix.peer]
            if not unix.name and other.name:  # the accepted end first (the other end's peer)
                continue
            listener = next((g for i, g in socket_groups.items() if diag.get(i) is not None and
                             diag[i].state == LISTEN and unix.name and diag[i].name == unix.name), None)
            if listener is not None:
                # accepted from a listener of the tree: accepted again from the clone's, so it keeps its name
                if listener[0].oid < 0:
                    oid = reading.add(kind="unix_listen", path=unix.name, count=unix.type,
                                      flags=listener[0].flags & STATUS_FLAGS)
                    for fd in listener:
                        fd.oid = oid
                oid = reading.add(kind="accepted", peer=listener[0].oid, flags=head.flags & STATUS_FLAGS,
                                  source_pid=head.host_pid, source_where=f"fd/{head.num}")
            else:
                oid = reading.add(kind="socketpair", count=unix.type, flags=head.flags & STATUS_FLAGS,
                                  source_pid=head.host_pid, source_where=f"fd/{head.num}", path=unix.name,
                                  options=_socket_options(head))
            peer_oid = reading.add(kind="socketpair_b", peer=oid, flags=peer[0].flags & STATUS_FLAGS,
                                   source_pid=peer[0].host_pid, source_where=f"fd/{peer[0].num}", path=other.name,
                                   options=_socket_options(peer[0]))
            for fd in peer:
                fd.oid = peer_oid
        elif unix.state == ESTABLISHED and any(inode in d.pending for d in diag.values()):
            raise TreeForkRefused(head.culprit, "a connection not yet accepted by its listener")
        elif unix.state == ESTABLISHED:
            # connected, its peer closed since (a server that dropped it): a pair whose other end the builder
            # closes once the clone has this one, which reads what was sent before, then EOF
            if unix.type == socket.SOCK_DGRAM:
                raise TreeForkRefused(head.culprit, "a datagram socket whose peer is gone")
            oid = reading.add(kind="socketpair", count=unix.type, flags=head.flags & STATUS_FLAGS,
                              source_pid=head.host_pid, source_where=f"fd/{head.num}", path=unix.name,
                              options=_socket_options(head))
        else:
            oid = reading.add(kind="unix", path=unix.name, count=unix.type, flags=head.flags & STATUS_FLAGS)
        for fd in group:
            fd.oid = oid


def _socket_options(fd: _Fd) -> int:
    """The options of a socket pair's end the clone's must have too (``SO_PASSCRED``)."""
    with socket.socket(fileno=syscalls.descriptor_of(fd.host_pid, fd.num)) as sock:
        return SOCKET_PASSCRED if sock.getsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED) else 0


TCP_CLOSE_WAIT = 8  # include/net/tcp_states.h


def _other_socket(reading: _Reading, group: list[_Fd], netlink: dict[int, NetlinkSocket]) -> None:
    """A TCP listener (its address, again in the clone's network namespace), a netlink socket (its protocol, port
    id and groups, again in the clone's network namespace, with nothing in flight); any other socket is refused, a
    TCP connection its peer has closed as a transient state (the program closes it once it reads the end: a web
    server between a client's close and its next poll)."""
    head = group[0]
    with socket.socket(fileno=syscalls.descriptor_of(head.host_pid, head.num)) as sock:
        family, stype = sock.family, sock.type
        listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        address = sock.getsockname() if family in (socket.AF_INET, socket.AF_INET6) else None
        tcp_state = (sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]
                     if address is not None and stype == socket.SOCK_STREAM and not listening else 0)
    if tcp_state == TCP_CLOSE_WAIT:
        raise TreeForkRefused(head.culprit, "a TCP connection closed by its peer, still open here (not "
                                            "reproduced; the program closes it once it reads the end)")
    oid = -1
    if family in (socket.AF_INET, socket.AF_INET6) and stype == socket.SOCK_STREAM and listening and address:
        oid = reading.add(kind="tcp_listen", path=address[0], count=address[1], peer=int(family),
                          flags=head.flags & STATUS_FLAGS)
    elif family == socket.AF_NETLINK and (known := netlink.get(int(head.link[8:-1]))) is not None:
        if known.queued:
            raise TreeForkRefused(head.culprit, f"a netlink socket with {known.queued} bytes of messages in "
                                                "flight")
        oid = reading.add(kind="netlink", count=int(stype), protocol=known.protocol, port=known.port,
                          groups=known.groups, flags=head.flags & STATUS_FLAGS)
    if oid >= 0:
        for fd in group:
            fd.oid = oid
        return
    what = {socket.AF_INET: "an IPv4", socket.AF_INET6: "an IPv6"}.get(family, "a")
    raise TreeForkRefused(head.culprit, f"{what} socket other than a TCP listener (not reproduced)")


def _pipe_size(fd: _Fd) -> int:
    opened = os.open(f"/proc/{fd.host_pid}/fd/{fd.num}", os.O_RDONLY | os.O_NONBLOCK)
    try:
        return fcntl.fcntl(opened, 1032)  # F_GETPIPE_SZ
    finally:
        os.close(opened)


def _shared_memory_oid(reading: _Reading, key: tuple[int, int], kind: str, path: str, source_pid: int,
                       where: str, seals: int = 0, offset: int = 0) -> int:
    """The copy of one shared-memory file (by device and inode), made once for every descriptor and mapping of it:
    a memfd named as the source's (``path``: its name), or a file at ``path`` in the clone's /dev/shm."""
    if key not in reading.by_inode:
        unlinked = path.endswith(" (deleted)")
        reading.by_inode[key] = reading.add(kind=kind, path=path.removesuffix(" (deleted)"), seals=seals,
                                            source_pid=source_pid, source_where=where, count=int(unlinked),
                                            offset=offset)
    return reading.by_inode[key]


def _file_object(reading: _Reading, group: list[_Fd]) -> int:
    head = group[0]
    link = head.link
    if link.startswith("anon_inode:"):
        what = link.removeprefix("anon_inode:")
        if what == "[eventfd]":
            count = int(re.search(r"^eventfd-count:\s+([0-9a-f]+)", head.info, re.M).group(1), 16)  # type: ignore[union-attr]
            return reading.add(kind="eventfd", count=count, flags=head.flags & STATUS_FLAGS)
        if what == "[eventpoll]":
            return reading.add(kind="epoll", flags=head.flags & STATUS_FLAGS)
        if what == "[pidfd]":  # opened again by its process's helper, on the clone's process of the same pid
            target = int(re.search(r"^Pid:\s+(-?\d+)", head.info, re.M).group(1))  # type: ignore[union-attr]
            if target not in reading.tree:
                raise TreeForkRefused(head.culprit, "a pidfd of a process outside the tree" if target > 0 else
                                      "a pidfd of a process that is gone")
            if len({fd.host_pid for fd in group}) > 1:
                raise TreeForkRefused(head.culprit, "a pidfd open in two processes (not reproduced)")
            return reading.add(kind="pidfd", count=reading.tree[target], flags=head.flags & os.O_NONBLOCK)
        if what == "inotify":
            queued = queued_bytes(head.host_pid, head.num)
            if queued:
                raise TreeForkRefused(head.culprit, f"an inotify instance with {queued} bytes of events queued")
            watches = inotify_watches(head.host_pid, head.info, reading.root, head.culprit)
            return reading.add(kind="inotify", watches=tuple(watches), flags=head.flags & STATUS_FLAGS)
        raise TreeForkRefused(head.culprit, UNSUPPORTED_ANON.get(what, f"an unknown kind of file ({what})"))
    proc_path = f"/proc/{head.host_pid}/fd/{head.num}"
    st = os.stat(proc_path)
    if link.startswith("/memfd:"):
        name = link.removeprefix("/memfd:").removesuffix(" (deleted)")  # a memfd is always "deleted"
        fd = os.open(proc_path, os.O_RDONLY)
        try:
            seals = _seals(fd)
        finally:
            os.close(fd)
        return _open_copy(reading, head, _shared_memory_oid(reading, (st.st_dev, st.st_ino), "memfd", name,
                                                            head.host_pid, f"fd/{head.num}", seals, head.pos))
    device = STATELESS_DEVICES.get((os.major(st.st_rdev), os.minor(st.st_rdev))) if stat.S_ISCHR(st.st_mode) \
        else None
    if device is not None:  # wherever it was opened (a launcher's /dev/null is outside the tree's root)
        return reading.add(kind="file", path=device, flags=head.flags & ~os.O_CLOEXEC)
    path = inside(link, reading.root, head.culprit)
    if (path.startswith("/dev/shm/") or link.endswith(" (deleted)")) and stat.S_ISREG(st.st_mode):
        # a /dev/shm file, or a ghost (a deleted file: made again at its path, filled with its contents, unlinked)
        return _open_copy(reading, head, _shared_memory_oid(reading, (st.st_dev, st.st_ino), "shm", path,
                                                            head.host_pid, f"fd/{head.num}", offset=head.pos))
    if path.startswith("/proc/") and stat.S_ISREG(st.st_mode):
        # opened again by its process's helper in the clone's /proc (Chromium keeps /proc/self/statm open)
        if len({fd.host_pid for fd in group}) > 1:
            raise TreeForkRefused(head.culprit, "a /proc file open in two processes (not reproduced)")
        return reading.add(kind="proc", path=path, flags=head.flags & ~os.O_CLOEXEC, offset=head.pos)
    if stat.S_ISREG(st.st_mode):
        return reading.add(kind="file", path=path, flags=head.flags & ~os.O_CLOEXEC, offset=head.pos)
    if stat.S_ISDIR(st.st_mode):
        return reading.add(kind="dir", path=path, flags=head.flags & ~os.O_CLOEXEC, offset=head.pos)
    kind = "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else \
        "a named pipe" if stat.S_ISFIFO(st.st_mode) else "a file of an unknown type"
    raise TreeForkRefused(head.culprit, f"{kind} (not reproduced)")


def _open_copy(reading: _Reading, head: _Fd, copy: int) -> int:
    """The open file of a shared-memory copy a group of descriptors has: the copy itself (opened read-write) for
    the first read-write one, else the copy opened again with the group's access mode and position (Chromium hands
    its renderers read-only descriptors of its memfds)."""
    if head.flags & os.O_ACCMODE == os.O_RDWR and copy not in reading.copies_in_use:
        reading.copies_in_use.add(copy)
        return copy
    return reading.add(kind="reopen", peer=copy, flags=head.flags & (os.O_ACCMODE | STATUS_FLAGS), offset=head.pos)


def _seals(fd: int) -> int:
    try:
        return fcntl.fcntl(fd, 1034)  # F_GET_SEALS
    except OSError:
        return 0


def _epoll_watches(reading: _Reading, fds: list[_Fd]) -> None:
    """Each epoll's interest list, added again by a process holding it, with the descriptor numbers it names (the
    numbers the entries were added with: they must still name the same files there)."""
    by_proc: dict[int, dict[int, _Fd]] = {}
    for fd in fds:
        by_proc.setdefault(fd.host_pid, {})[fd.num] = fd
    done: set[int] = set()
    for fd in fds:
        if fd.link != "anon_inode:[eventpoll]" or fd.oid in done:
            continue
        done.add(fd.oid)
        for m in re.finditer(r"^tfd:\s+(\d+)\s+events:\s+([0-9a-f]+)\s+data:\s+([0-9a-f]+)\s+pos:\s*\d+\s+ino:\s*([0-9a-f]+)",
                             fd.info, re.M):
            target = by_proc[fd.host_pid].get(int(m.group(1)))
            if target is None or os.stat(f"/proc/{target.host_pid}/fd/{target.num}").st_ino != int(m.group(4), 16):
                raise TreeForkRefused(fd.culprit, f"watches descriptor {m.group(1)}, which its process closed or "
                                                  "reused")
            reading.watches.append(Watch(pid=fd.pid, epoll_fd=fd.num, target_fd=target.num,
                                         events=int(m.group(2), 16), data=int(m.group(3), 16)))


def _remaps(reading: _Reading, host_pid: int, pid: int) -> list[Remap]:
    """The mappings the clone takes from its own copy of their file: of shared memory (memfd, /dev/shm), shared
    mappings of a deleted file (its ghost copy) and writable shared mappings of a file on a writable mount (the
    clone's file at its path, in the clone's snapshot). Read-only shared mappings of a file, or any of a file on a
    read-only mount, stay as fork() leaves them (glibc maps its gconv cache so); SysV shared memory (X's MIT-SHM),
    onto the clone's copy of its segment."""
    out = []
    for line in Path(f"/proc/{host_pid}/maps").read_text().splitlines():
        m = MAPS.match(line)
        if not m:
            continue
        start, end, perms, major, minor, inode, name = m.groups()
        where = f"{start}-{end}"
        culprit = f"pid {pid} mapping {where} ({name or 'anonymous'})"
        shared = perms[3] == "s"
        if name.startswith("/SYSV"):
            oid = _segment_oid(reading, host_pid, int(inode), where, culprit)
            out.append(Remap(source_pid=host_pid, where=where, oid=oid))
            continue
        memfd = name.startswith("/memfd:")
        shm = name.startswith(f"{reading.root}/dev/shm/")
        if (memfd or shm) and int(inode):
            if not shared and _has_own_pages(host_pid, int(start, 16), int(end, 16)):
                raise TreeForkRefused(culprit, "a private mapping of shared memory holding pages of its own")
            key = (os.makedev(int(major, 16), int(minor, 16)), int(inode))
            if memfd:
                oid = _shared_memory_oid(reading, key, "memfd", name.removeprefix("/memfd:").removesuffix(
                    " (deleted)"), host_pid, f"map_files/{where}")
            else:
                oid = _shared_memory_oid(reading, key, "shm", inside(name, reading.root, culprit), host_pid,
                                         f"map_files/{where}")
            out.append(Remap(source_pid=host_pid, where=where, oid=oid))
        elif shared and name.startswith("/dev/zero"):
            raise TreeForkRefused(culprit, "a shared anonymous mapping (not reproduced yet)")
        elif shared and name.startswith("/") and int(inode):
            key = (os.makedev(int(major, 16), int(minor, 16)), int(inode))
            source = f"/proc/{host_pid}/map_files/{where}"
            if name.endswith(" (deleted)"):
                oid = _shared_memory_oid(reading, key, "shm", inside(name, reading.root, culprit), host_pid,
                                         f"map_files/{where}")
            elif perms[1] != "w" or os.statvfs(source).f_flag & os.ST_RDONLY:
                continue  # as fork() leaves it: both map one file they cannot write through it, or cannot write
            else:
                if key not in reading.mapped_files:
                    reading.mapped_files[key] = reading.add(kind="file", path=inside(name, reading.root, culprit),
                                                            flags=os.O_RDWR)
                oid = reading.mapped_files[key]
            out.append(Remap(source_pid=host_pid, where=where, oid=oid))
    return out


def _segment_oid(reading: _Reading, host_pid: int, shmid: int, where: str, culprit: str) -> int:
    """The clone's copy of SysV segment ``shmid`` (the inode number its mappings show), made once for every
    mapping of it. The tree's IPC namespace must be its own (else the segment is the host's too)."""
    ipc = reading.ipc(host_pid)
    if ipc.ours:
        raise TreeForkRefused(culprit, "SysV shared memory in the host's IPC namespace, not the tree's own")
    if shmid not in ipc.segments:
        raise TreeForkRefused(culprit, f"SysV segment {shmid} is not in the tree's IPC namespace")
    if shmid not in reading.segments:
        reading.segments[shmid] = reading.add(kind="sysv", segment=ipc.segments[shmid], source_pid=host_pid,
                                              source_where=f"map_files/{where}")
    return reading.segments[shmid]


def _check_ipc(reading: _Reading, init_host_pid: int) -> None:
    """What of SysV IPC a clone would miss: semaphore sets and message queues of the tree's own IPC namespace (not
    reproduced yet), and a segment of it that no process of the tree maps (made again only through a mapping)."""
    ipc = reading.ipc(init_host_pid)
    if ipc.ours:
        return
    culprit = "pid 1's IPC namespace"
    if ipc.semaphores or ipc.queues:
        raise TreeForkRefused(culprit, f"{ipc.semaphores} SysV semaphore sets and {ipc.queues} message queues "
                                       "(not reproduced yet)")
    for shmid, seg in sorted(ipc.segments.items()):
        if shmid not in reading.segments:
            raise TreeForkRefused(culprit, f"SysV segment {shmid} (key {seg.key}) that no process of the tree "
                                           "maps (not reproduced yet)")


def _has_own_pages(host_pid: int, start: int, end: int) -> bool:
    """Whether a private file mapping holds pages of its own (copied on write: anonymous, present or swapped), from
    the pagemap of its range (not smaps: generating it walks every mapping of the process, seconds for a browser
    under emulation)."""
    with open(f"/proc/{host_pid}/pagemap", "rb", buffering=0) as f:
        f.seek(start // 4096 * 8)
        entries = f.read((end - start) // 4096 * 8)
    return any((entry >> 63 and not entry >> 61 & 1) or entry >> 62 & 1
               for (entry,) in struct.iter_unpack("Q", entries))


def _rlimits(host_pid: int) -> dict[int, tuple[int, int]]:
    out = {}
    try:
        for res in range(16):
            cur, mx = resource.prlimit(host_pid, res)
            out[res] = (RLIM_INFINITY if cur < 0 else cur, RLIM_INFINITY if mx < 0 else mx)
    except PermissionError:  # another user's process, and no CAP_SYS_RESOURCE here: its limits file says the same
        return _rlimits_from_proc(host_pid)
    return out


def _rlimits_from_proc(host_pid: int) -> dict[int, tuple[int, int]]:
    """/proc/PID/limits: one line per resource, in resource order, after a header; soft and hard limits are the
    two columns after the name ("unlimited" or a number)."""
    lines = Path(f"/proc/{host_pid}/limits").read_text().splitlines()[1:17]
    out = {}
    for res, line in enumerate(lines):
        soft, hard = line[26:].split()[:2]
        out[res] = tuple(RLIM_INFINITY if v == "unlimited" else int(v) for v in (soft, hard))
    return out  # type: ignore[return-value]


def read_tree(init_host_pid: int, hostname: str = "", inherit: Mapping[tuple[int, int], int] | None = None) -> TreePlan:
    """The plan of a clone of the frozen tree whose root is ``init_host_pid`` (pid 1 of its pid namespace).

    ``inherit`` maps descriptors of the tree, (pid in the tree's namespace, number), to descriptors of the caller's
    that the clone gets in their place (passed to the builder at the same numbers: ``TreeForkBuild``'s
    ``pass_fds``), as CRIU's ``--inherit-fd`` does: a channel to the engine, say, which the clone must not share
    with its source. Every descriptor of the same open file is the caller's one too; nothing of the source's file
    is read or refused."""
    root = os.readlink(f"/proc/{init_host_pid}/root")
    reading = _Reading(root="" if root == "/" else root)
    init_status = status(init_host_pid)
    if last(init_status["NSpid"]) != 1:
        raise TreeForkRefused(f"pid {init_host_pid}", "the tree's root is not pid 1 of its pid namespace")
    processes: list[ProcessPlan] = []
    ns_of: dict[int, int] = {}
    fds: list[_Fd] = []
    ttys: dict[int, tuple[int, int]] = {}  # each process's controlling terminal and its foreground group
    for host_pid in walk(init_host_pid):
        st = init_status if host_pid == init_host_pid else status(host_pid)
        pid = last(st["NSpid"])
        ns_of[host_pid] = pid
        culprit = f"pid {pid} ({st['Name']})"
        uids, gids = st["Uid"].split(), st["Gid"].split()
        stat_fields = Path(f"/proc/{host_pid}/stat").read_text().rsplit(")", 1)[1].split()
        if st["State"].startswith(("Z", "X")):
            # a zombie: made again, it exits at once with the same status, for its parent to reap
            processes.append(ProcessPlan(
                pid=pid, host_pid=host_pid, ppid=ns_of.get(int(st["PPid"]), 0), sid=last(st["NSsid"]),
                pgid=last(st["NSpgid"]), exit_signal=int(stat_fields[35]), uid=int(uids[0]), gid=int(gids[0]),
                groups=[], cwd="/", threads=[], descriptors=[], remaps=[], rlimits={}, comm=st["Name"],
                zombie=True, exit_code=int(stat_fields[49])))
            continue
        if len(set(uids)) != 1 or len(set(gids)) != 1:
            raise TreeForkRefused(culprit, f"real, effective and saved ids differ (uid {uids}, gid {gids})")
        if os.readlink(f"/proc/{host_pid}/root") != root:
            raise TreeForkRefused(culprit, "its root directory is not the tree's")
        threads = []
        for tid in sorted(map(int, os.listdir(f"/proc/{host_pid}/task"))):
            if tid != host_pid:
                threads.append(last(status(host_pid, tid)["NSpid"]))
        ppid = int(st["PPid"])
        ttys[host_pid] = int(stat_fields[4]), int(stat_fields[5])
        cwd = inside(os.readlink(f"/proc/{host_pid}/cwd"), reading.root, culprit)
        cgroup = cgroup_below(host_pid, init_host_pid, culprit)
        own = _read_fds(host_pid, pid)
        fds += own
        processes.append(ProcessPlan(
            pid=pid, host_pid=host_pid, ppid=ns_of.get(ppid, 0), sid=last(st["NSsid"]),
            pgid=last(st["NSpgid"]), exit_signal=int(stat_fields[35]), uid=int(uids[0]), gid=int(gids[0]),
            groups=[int(g) for g in st["Groups"].split()], cwd=cwd, threads=threads, descriptors=[],
            remaps=[], rlimits=_rlimits(host_pid), comm=st["Name"], cgroup=cgroup))
    processes = _place_sessions(processes)
    reading.tree = dict(ns_of)
    groups = _inherited_objects(reading, _group_open_files(fds), inherit or {})
    _pipe_objects(reading, groups)
    _socket_objects(reading, groups, init_host_pid)
    _terminal_objects(reading, groups, init_host_pid)
    _controlling_terminals(reading, processes, ttys, ns_of)
    for group in groups:
        if group[0].oid < 0:
            oid = _file_object(reading, group)
            for fd in group:
                fd.oid = oid
    _epoll_watches(reading, fds)
    by_pid = {p.host_pid: p for p in processes}
    for fd in fds:
        by_pid[fd.host_pid].descriptors.append(Descriptor(num=fd.num, oid=fd.oid,
                                                          cloexec=bool(fd.flags & os.O_CLOEXEC)))
    for p in processes:
        if not p.zombie and not p.placeholder:
            _check_namespaces(p, init_host_pid)
            p.remaps = _remaps(reading, p.host_pid, p.pid)
    _check_ipc(reading, init_host_pid)
    return TreePlan(processes=processes, files=reading.files, watches=reading.watches,
                    hostname=hostname or _hostname(init_host_pid))


NAMESPACES = ("pid", "mnt", "net", "uts", "ipc", "user", "cgroup")


def _check_namespaces(p: ProcessPlan, init_host_pid: int) -> None:
    """Every process of the tree in the tree's namespaces: the clone's are one of each (a pid namespace nested
    below the tree's, an agent's or a sandboxed renderer's, is not reproduced yet)."""
    for kind in NAMESPACES:
        if os.stat(f"/proc/{p.host_pid}/ns/{kind}").st_ino != os.stat(f"/proc/{init_host_pid}/ns/{kind}").st_ino:
            what = "an IPC" if kind == "ipc" else f"a {kind}"
            raise TreeForkRefused(f"pid {p.pid} ({p.comm})", f"{what} namespace other than the tree's")


def _inherited_objects(reading: _Reading, groups: list[list[_Fd]], inherit: Mapping[tuple[int, int], int]) -> \
        list[list[_Fd]]:
    """The open files the caller gives the clone in place of the source's (``inherit``), each an ``inherit``
    object; the other groups, left to read."""
    if not inherit:
        return groups
    named = {(fd.pid, fd.num) for group in groups for fd in group}
    unknown = sorted(set(inherit) - named)
    if unknown:
        raise ValueError(f"inherit names descriptors the tree does not have: {unknown}")
    rest = []
    for group in groups:
        slots = {inherit[fd.pid, fd.num] for fd in group if (fd.pid, fd.num) in inherit}
        if not slots:
            rest.append(group)
            continue
        if len(slots) > 1:
            raise ValueError(f"inherit gives one open file two descriptors ({sorted(slots)}): {group[0].culprit}")
        oid = reading.add(kind="inherit", count=slots.pop())
        for fd in group:
            fd.oid = oid
    return rest


def _hostname(host_pid: int) -> str:
    """The source's host name: ours when it shares our UTS namespace, else the caller must say."""
    if os.stat(f"/proc/{host_pid}/ns/uts").st_ino == os.stat("/proc/self/ns/uts").st_ino:
        return os.uname().nodename
    raise ValueError(f"pid {host_pid} has a UTS namespace of its own: pass its hostname")


def _place_sessions(processes: list[ProcessPlan]) -> list[ProcessPlan]:
    """The processes in an order the builder can make their sessions and process groups in: a process is its
    session's leader or in its parent's session, or in a session whose leader is gone from the source (a daemon's
    double fork), which a placeholder process with the session's number starts for it (inserted before it, made by
    its parent; see ``ProcessPlan.placeholder``), or in the session of a sibling that leads it (its parent adopted
    it when its own died: D-Bus's activated services), which makes it with ``CLONE_PARENT`` (``maker``). A process group's leader is built before its members, in the same
    session. A session or group numbered 0 is led from outside the tree's pid namespace: the clone's is the
    builder's, inherited alike."""
    taken = {p.pid for p in processes} | {t for p in processes for t in p.threads}
    built: dict[int, ProcessPlan] = {}
    out: list[ProcessPlan] = []
    for p in processes:
        parent = built.get(p.ppid)
        culprit = f"pid {p.pid} ({p.comm})"
        if p.sid not in (0, p.pid) and parent is not None and parent.sid != p.sid:
            holder = built.get(p.sid)
            if holder is not None and not holder.placeholder:
                # its parent adopted it, and its session's leader is alive: a sibling of it, which makes it
                if holder.zombie or (holder.ppid, holder.exit_signal) != (p.ppid, p.exit_signal):
                    raise TreeForkRefused(culprit, f"in session {p.sid}, neither its own nor its parent's "
                                                   f"({parent.sid}), and its leader is alive with another parent "
                                                   "or exit signal")
            elif holder is None and p.sid in taken:
                raise TreeForkRefused(culprit, f"in session {p.sid}, neither its own nor its parent's "
                                               f"({parent.sid}), and its leader is alive, not made before it")
            elif holder is None:
                holder = ProcessPlan(pid=p.sid, host_pid=0, ppid=p.ppid, sid=p.sid, pgid=p.sid,
                                     exit_signal=p.exit_signal, uid=0, gid=0, groups=[], cwd="/", threads=[],
                                     descriptors=[], remaps=[], rlimits={}, comm="session", placeholder=True)
                built[holder.pid] = holder
                out.append(holder)
            elif (holder.ppid, holder.exit_signal) != (p.ppid, p.exit_signal):
                raise TreeForkRefused(culprit, f"in session {p.sid}, whose leader is gone, with another parent or "
                                               "exit signal than the session's other orphans")
            p.maker = holder.pid
        if p.pgid == 0 and parent is not None and parent.pgid != 0:
            raise TreeForkRefused(culprit, "in a process group led from outside the tree, its parent is not")
        if p.pgid not in (0, p.pid):
            leader = built.get(p.pgid)
            if leader is None:
                raise TreeForkRefused(culprit, f"in process group {p.pgid}, whose leader is not built before it")
            if leader.sid != p.sid:
                raise TreeForkRefused(culprit, "its process group is in another session")
        built[p.pid] = p
        out.append(p)
    return out

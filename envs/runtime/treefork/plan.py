"""What the tree-fork builder (``kmod/treefork/builder.c``) is asked to build: the clone's processes, threads, open
files and shared-memory copies, and its rendering as the builder's line format.

Owns: the plan's types and ``render``. Reading a source into a plan is ``reader.py``'s; running the builder is
``fork.py``'s.
Must never: hold anything open: a plan is data (pids and paths), valid only while its source stays frozen.
"""

from __future__ import annotations

import msgspec

SOCKET_PASSCRED = 1  # OpenFile.options: the socket passes credentials (SO_PASSCRED)


class InotifyWatch(msgspec.Struct, frozen=True):
    """One watch of an inotify instance: its descriptor number, event mask and what it watches (a path in the
    clone's root)."""

    wd: int
    mask: int
    path: str


SHM_DEST = 0o1000  # in a SysV segment's mode: removed (IPC_RMID), it lives until its last detach


class Segment(msgspec.Struct, frozen=True):
    """One shared memory segment: its key (0: IPC_PRIVATE, as every removed one's is), id, mode (with
    ``SHM_DEST``), size in bytes, owner and how many attaches it has."""

    key: int
    shmid: int
    mode: int
    size: int
    uid: int
    gid: int
    nattch: int = 0

    @property
    def removed(self) -> bool:
        return bool(self.mode & SHM_DEST)


class Terminal(msgspec.Struct, frozen=True):
    """A pty's state, set on the clone's pair: its index in the devpts instance (the clone's /dev/pts/N has the
    same N), its slave's termios (the kernel's ``struct termios``, as TCGETS gives it) and window size (TIOCGWINSZ),
    and whether its master is in packet mode."""

    index: int
    termios: bytes
    winsize: bytes
    packet: bool = False


class OpenFile(msgspec.Struct, frozen=True):
    """One open file of the clone, shared by every descriptor (in any process) that names its ``oid``.

    ``kind``: ``pipe`` (a pipe's read end; ``source`` is a source process and descriptor whose bytes in flight are
    copied), ``pipe_w`` (the write end of pipe ``peer``), ``file`` (``path`` in the clone's root, opened with
    ``flags``, at ``offset``), ``dir``, ``eventfd`` (``count``), ``memfd`` (a copy of the source's memfd, named
    ``path``) or ``shm`` (a copy of a /dev/shm file at ``path`` in the clone's root, unlinked when ``count`` is 1),
    copied from ``/proc/<source_pid>/<source_where>``, ``epoll`` (its interest list is ``Watch``es); terminals:
    ``ptmx`` (a pty's master, opened at ``path`` with ``flags`` until it has the source's index, set as its
    ``terminal`` says), ``pts`` (the slave of master ``peer``, opened at ``path`` with ``flags``); sockets:
    ``socketpair`` (a connected Unix pair of type ``count``, whose other end is the ``socketpair_b`` naming it as
    ``peer``; each end's bytes in flight are copied from the source's descriptor ``source_where``; an end bound to a
    name, ``path`` (an autobound abstract one: it had ``SO_PASSCRED``), is bound to it again), ``accepted``
    (the same, but made by connecting to the clone's listener ``peer`` and accepting: it keeps the listener's
    name, as an accepted connection does), ``unix_listen``
    (type ``count``, listening at ``path``, "@name" for an abstract name), ``unix`` (unconnected, bound to ``path``
    if any), ``tcp_listen`` (family ``peer``, address ``path``, port ``count``), ``netlink`` (type ``count``,
    ``protocol``, bound to port id ``port`` and multicast ``groups``, made again in the clone's network namespace),
    ``proc`` (a /proc file at ``path``, opened like ``file`` but by its process's helper, in the clone's /proc),
    ``pidfd`` (of the clone's process ``count``, opened by its holder's helper once that process is made, with
    ``flags``: ``PIDFD_NONBLOCK``),
    ``inotify`` (its ``watches`` added again in order, each with its source's descriptor number), ``reopen`` (the
    copy ``peer`` opened again, with access mode and status ``flags``, at ``offset``: another open file of it).
    A ``shm`` copy with ``count`` 1 is also how a deleted file (a "ghost") is made again: created at its path,
    filled, unlinked. ``sysv``: a SysV shared memory ``segment`` made again in the clone's IPC namespace with the
    same id, key, size, mode and owner, its resident pages copied from the source's mapping ``source_where``, and
    removed again once the clone has it attached if the source's was. ``inherit``: the caller's descriptor
    ``count`` (passed to the builder at that number), in place of the source's open file.
    """

    oid: int
    kind: str
    flags: int = 0  # file status flags (F_SETFL); open flags for a file
    path: str = ""
    offset: int = 0  # a file's or memfd's
    count: int = 0
    seals: int = 0
    peer: int = -1
    pipe_size: int = 0
    source_pid: int = 0  # in the builder's pid namespace
    source_where: str = ""  # "fd/N" or "map_files/START-END" under /proc/<source_pid>
    options: int = 0  # a socket pair's end: SOCKET_PASSCRED
    protocol: int = 0  # a netlink socket's
    port: int = 0
    groups: int = 0
    watches: tuple[InotifyWatch, ...] = ()  # an inotify instance's, by ascending descriptor number
    segment: Segment | None = None  # a SysV segment's
    terminal: Terminal | None = None  # a pty master's


class Watch(msgspec.Struct, frozen=True):
    """One entry of an epoll's interest list, added by the clone process ``pid`` with its own descriptor numbers
    (epoll keys an entry by file and number: a clone's EPOLL_CTL_MOD or DEL names the number its source used)."""

    pid: int
    epoll_fd: int
    target_fd: int
    events: int
    data: int


class Descriptor(msgspec.Struct, frozen=True):
    num: int
    oid: int
    cloexec: bool


class Remap(msgspec.Struct, frozen=True):
    """A mapping of shared memory the clone maps from its own copy (object ``oid``) instead of the source's file."""

    source_pid: int
    where: str  # START-END, as in /proc/<pid>/map_files
    oid: int


class ProcessPlan(msgspec.Struct):
    pid: int  # in the source's pid namespace: the clone keeps it
    host_pid: int  # the source's, as the builder sees it
    ppid: int
    sid: int
    pgid: int
    exit_signal: int
    uid: int
    gid: int
    groups: list[int]
    cwd: str
    threads: list[int]  # the other threads' tids (the source's namespace), the main thread's is pid
    descriptors: list[Descriptor]
    remaps: list[Remap]
    rlimits: dict[int, tuple[int, int]]
    comm: str = ""
    zombie: bool = False  # made, then exits at once with ``exit_code`` (a wait status) for its parent to reap
    exit_code: int = 0
    # a session whose leader is gone from the source (a daemon's double fork): a placeholder with the session's
    # number starts it (setsid), makes its members with CLONE_PARENT (so they are its parent's children, as in the
    # source), exits and is reaped by its parent's helper before the graft; nothing of it is left in the clone
    placeholder: bool = False
    maker: int = 0  # who makes this process with CLONE_PARENT: a placeholder or its session's leader (0: its parent)
    cgroup: str = ""  # its cgroup (v2) below the tree's pid 1's, "" for that one: the clone's is the same below its own
    ctty: int = -1  # a session leader's controlling terminal: the ``pts`` object it takes (TIOCSCTTY) after setsid
    foreground: int = -1  # a process group's leader: the ``pts`` object whose foreground group it makes its own


class TreePlan(msgspec.Struct):
    processes: list[ProcessPlan]  # parents before children; the first is the tree's pid 1
    files: list[OpenFile]
    watches: list[Watch]
    hostname: str
    root: str = ""  # the clone's root directory, as the builder sees it
    cgroup: str = "-"
    hold: bool = True

    @property
    def cgroups(self) -> list[str]:
        """The cgroups below the clone's own that its processes join, parents first (the caller makes them)."""
        return sorted({p.cgroup for p in self.processes if p.cgroup}, key=lambda c: (c.count("/"), c))

    @property
    def close_from(self) -> int:
        """The first descriptor number no clone process uses: the builder's own descriptors go from there."""
        return max([3] + [d.num + 1 for p in self.processes for d in p.descriptors])


def render(plan: TreePlan) -> str:
    """The plan in the builder's line format (see ``kmod/treefork/builder.c``)."""
    out = [f"close_from {plan.close_from}", f"hold {int(plan.hold)}", f"hostname {plan.hostname}",
           f"cgroup {plan.cgroup}"]
    if plan.root:
        out.append(f"root {plan.root}")
    for f in plan.files:
        if f.kind == "pipe":
            fd = f.source_where.removeprefix("fd/") if f.source_where else "-1"
            out.append(f"obj {f.oid} pipe {f.source_pid or -1} {fd} {f.pipe_size}")
        elif f.kind == "pipe_w":
            out.append(f"obj {f.oid} pipe_w {f.peer}")
        elif f.kind == "file":
            out.append(f"obj {f.oid} file {f.flags} {f.offset} {f.path}")
        elif f.kind in ("dir", "proc"):
            out.append(f"obj {f.oid} {f.kind} {f.flags} {f.offset} {f.path}")
        elif f.kind == "eventfd":
            out.append(f"obj {f.oid} eventfd {f.count} {f.flags}")
        elif f.kind in ("memfd", "shm"):
            out.append(f"obj {f.oid} {f.kind} {f.flags} {f.seals} {f.source_pid} {f.source_where} {f.count} "
                       f"{f.offset} {f.path}")
        elif f.kind == "epoll":
            out.append(f"obj {f.oid} epoll")
        elif f.kind in ("socketpair", "accepted", "socketpair_b"):
            first = f.count if f.kind == "socketpair" else f.peer
            out.append(f"obj {f.oid} {f.kind} {first} {f.source_pid} {f.source_where.removeprefix('fd/')} "
                       f"{f.options} {f.path or '-'}")
        elif f.kind in ("unix_listen", "unix"):
            out.append(f"obj {f.oid} {f.kind} {f.count} {f.path or '-'}")
        elif f.kind == "tcp_listen":
            out.append(f"obj {f.oid} tcp_listen {f.peer} {f.count} {f.path}")
        elif f.kind == "netlink":
            out.append(f"obj {f.oid} netlink {f.count} {f.protocol} {f.port} {f.groups}")
        elif f.kind == "reopen":
            out.append(f"obj {f.oid} reopen {f.peer} {f.flags} {f.offset}")
        elif f.kind == "sysv" and f.segment is not None:
            g = f.segment
            out.append(f"obj {f.oid} sysv {g.shmid} {g.key} {g.mode} {g.size} {g.uid} {g.gid} {f.source_pid} "
                       f"{f.source_where}")
        elif f.kind == "ptmx" and f.terminal is not None:
            t = f.terminal
            out.append(f"obj {f.oid} ptmx {f.flags} {t.index} {int(t.packet)} {t.termios.hex()} {t.winsize.hex()} "
                       f"{f.path}")
        elif f.kind == "pts":
            out.append(f"obj {f.oid} pts {f.peer} {f.flags} {f.path}")
        elif f.kind == "pidfd":
            out.append(f"obj {f.oid} pidfd {f.count} {f.flags}")
        elif f.kind == "inherit":
            out.append(f"obj {f.oid} inherit {f.count}")
        elif f.kind == "inotify":
            out.append(f"obj {f.oid} inotify")
            out += [f"inotify_watch {f.oid} {w.wd} {w.mask} {w.path}" for w in f.watches]
        else:
            raise ValueError(f"unknown open-file kind {f.kind!r}")
        if f.kind not in ("file", "dir", "proc", "reopen", "ptmx", "pts", "pidfd") and f.flags:
            out.append(f"flags {f.oid} {f.flags}")
    for p in plan.processes:
        out.append(f"proc {p.pid} {p.host_pid} {p.ppid} {p.sid} {p.pgid} {p.exit_signal} {p.uid} {p.gid}")
        if p.groups:
            out.append(f"groups {p.pid} " + " ".join(map(str, p.groups)))
        if p.zombie:
            out.append(f"zombie {p.pid} {p.exit_code} {p.comm}")
        if p.placeholder:
            out.append(f"placeholder {p.pid}")
        if p.maker:
            out.append(f"maker {p.pid} {p.maker}")
        if p.cgroup:
            out.append(f"cgroup_of {p.pid} {p.cgroup}")
        if p.ctty >= 0:
            out.append(f"ctty {p.pid} {p.ctty}")
        if p.foreground >= 0:
            out.append(f"foreground {p.pid} {p.foreground}")
    for p in plan.processes:
        out.append(f"cwd {p.pid} {p.cwd}")
        out += [f"thread {p.pid} {tid}" for tid in p.threads]
        out += [f"fd {p.pid} {d.num} {d.oid} {int(d.cloexec)}" for d in p.descriptors]
        out += [f"remap {p.pid} {r.source_pid} {r.where} {r.oid}" for r in p.remaps]
        out += [f"watch {w.pid} {w.epoll_fd} {w.target_fd} {w.events} {w.data}" for w in plan.watches
                if w.pid == p.pid]
        out += [f"rlimit {p.pid} {res} {cur} {mx}" for res, (cur, mx) in sorted(p.rlimits.items())]
    out.append("end")
    return "\n".join(out) + "\n"

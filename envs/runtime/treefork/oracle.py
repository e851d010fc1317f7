"""The tree fork's oracle, in the spirit of CRIU's zdtm: with source and clone both frozen, compare what a process can
observe of itself (the tree and its pids, sessions and groups, threads, credentials, cwd, descriptors with their
flags, offsets and the bytes in flight in pipes, eventfd counts and epoll interest lists, memory maps with their
protections and names, memory contents by mapping, mounts; Unix sockets with their type, state, name, queued bytes
and peer; netlink sockets with their protocol, port id and groups; inotify watches with their numbers, masks and
paths; ptys with their index, termios, window size and queues; a session's controlling terminal and its foreground
group), then check they diverge independently: a byte
written into a private page of one is never seen by the other, page by page, and a page is shared until written.

Owns: ``describe`` (what a frozen tree shows, normalised so that two faithful copies compare equal: pipes numbered in
order of appearance, paths inside the tree's root) and ``compare``/``diverge`` (the differences, as sentences).
Must never: leave a trace in either tree: every byte ``diverge`` writes, it puts back.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import stat
import struct
from pathlib import Path
from typing import BinaryIO

from . import terminals
from .inotify import inotify_watches
from .procfs import MAPS, cgroup_below, inside, last, status, walk
from .reader import STATELESS_DEVICES
from .sockets import NetlinkSocket, UnixSocket, netlink_sockets, unix_sockets
from .sysv import read_ipc

FIONREAD = 0x541B
SKIPPED_MAPPINGS = ("[vvar]", "[vsyscall]")


def _pipe_bytes(host_pid: int, num: int) -> bytes:
    """The bytes in flight in a pipe, read without consuming them (tee into a pipe of our own)."""
    fd = os.open(f"/proc/{host_pid}/fd/{num}", os.O_RDONLY | os.O_NONBLOCK)
    try:
        pending = struct.unpack("i", fcntl.ioctl(fd, FIONREAD, b"\0\0\0\0"))[0]
        if not pending:
            return b""
        r, w = os.pipe()
        try:
            fcntl.fcntl(w, 1031, max(pending, 4096))  # F_SETPIPE_SZ
            copied = _tee(fd, w, pending)
            return os.read(r, copied)
        finally:
            os.close(r)
            os.close(w)
    finally:
        os.close(fd)


def _tee(src: int, dst: int, size: int) -> int:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    n = libc.tee(src, dst, ctypes.c_size_t(size), 2)  # SPLICE_F_NONBLOCK
    if n < 0:
        raise OSError(ctypes.get_errno(), "tee")
    return int(n)


def _fd_view(host_pid: int, num: int, root: str, names: dict[str, str], unix: dict[int, UnixSocket],
             netlink: dict[int, NetlinkSocket]) -> tuple[object, ...]:
    base = f"/proc/{host_pid}"
    link = os.readlink(f"{base}/fd/{num}")
    info = Path(f"{base}/fdinfo/{num}").read_text()
    flags = int(re.search(r"^flags:\s+([0-7]+)", info, re.M).group(1), 8)  # type: ignore[union-attr]
    pos = int(re.search(r"^pos:\s+(\d+)", info, re.M).group(1))  # type: ignore[union-attr]
    extra: object = None
    if link.startswith("socket:["):
        link_inode = link[8:-1]
        known = unix.get(int(link_inode))
        peer = f"socket:[{known.peer}]" if known is not None and known.peer else ""
        link = names.setdefault(link, f"socket#{len(names)}")
        # a Unix socket: its type, state, name, bytes queued, and its peer (numbered as the tree shows it)
        extra = (known.kind, known.state, known.name, known.queued, names.setdefault(peer, f"socket#{len(names)}")
                 if peer else "") if known is not None else "not a Unix socket"
        if (nl := netlink.get(int(link_inode))) is not None:  # a netlink socket: protocol, port id, groups, queue
            extra = ("netlink", nl.protocol, nl.port, nl.groups, nl.queued)
    elif link.startswith("pipe:"):
        link = names.setdefault(link, f"pipe#{len(names)}")
        if flags & os.O_ACCMODE == os.O_RDONLY:
            extra = _pipe_bytes(host_pid, num)
    elif link == "anon_inode:[eventfd]":
        extra = re.search(r"^eventfd-count:\s+(\S+)", info, re.M).group(1)  # type: ignore[union-attr]
    elif link == "anon_inode:[pidfd]":  # the process it refers to, by its pid in its own namespace
        extra = ("pidfd", re.search(r"^NSpid:.*?(-?\d+)$", info, re.M).group(1))  # type: ignore[union-attr]
    elif link == "anon_inode:[eventpoll]":
        extra = sorted(re.findall(r"^tfd:\s+(\d+)\s+events:\s+(\S+)\s+data:\s+(\S+)", info, re.M))
    elif link == "anon_inode:inotify":
        extra = [(w.wd, w.mask, w.path) for w in inotify_watches(host_pid, info, root, f"pid {host_pid} fd {num}")]
    elif link.startswith("/") and not link.startswith("/memfd:"):
        st = os.stat(f"{base}/fd/{num}")
        device = STATELESS_DEVICES.get((os.major(st.st_rdev), os.minor(st.st_rdev))) \
            if stat.S_ISCHR(st.st_mode) else None
        link = device or inside(link, root, f"pid {host_pid} fd {num}")
        if stat.S_ISCHR(st.st_mode) and terminals.is_master(st):  # a pty: its index, termios, window, packet mode
            t = terminals.read_master(host_pid, num, f"pid {host_pid} fd {num}")
            extra = ("ptmx", t.terminal.index, t.terminal.termios.hex(), t.terminal.winsize.hex(),
                     t.terminal.packet, t.queued_out, t.queued_in)
        elif stat.S_ISCHR(st.st_mode) and (index := terminals.slave_index(st.st_rdev)) is not None:
            extra = ("pts", index)
    return link, flags, pos, extra


def _maps(host_pid: int) -> list[tuple[str, str, str, str, str]]:
    out = []
    for line in Path(f"/proc/{host_pid}/maps").read_text().splitlines():
        m = MAPS.match(line)
        if m:
            start, end, perms, _, _, _, name = m.groups()
            out.append((start, end, perms, line.split()[2], name))
    return out


def _inside_roots(maps: object, roots: tuple[str, ...]) -> set[tuple[str, ...]]:
    """Mappings with a file's name inside either side's root: a clone maps the source's files where it shares them
    (a duplicated mm keeps them) and its own copies where a mapping was moved onto one."""
    out: set[tuple[str, ...]] = set()
    for start, end, perms, offset, name in maps:  # type: ignore[attr-defined]
        for root in roots:
            if root and name.startswith(root + "/"):
                name = name[len(root):]
                break
        out.add((start, end, perms, offset, name))
    return out


WIPED_ZERO = "wipe-on-fork, zero"


def _wipe_on_fork(host_pid: int) -> set[str]:
    """The mappings (START-END) marked MADV_WIPEONFORK (``wf`` in smaps' VmFlags)."""
    out, current = set(), ""
    for line in Path(f"/proc/{host_pid}/smaps").read_text().splitlines():
        if (m := MAPS.match(line)) is not None:
            current = f"{m.group(1)}-{m.group(2)}"
        elif line.startswith("VmFlags:") and " wf" in line:
            out.add(current)
    return out


def _private_pages(pagemap: BinaryIO, lo: int, hi: int) -> list[int]:
    """The addresses in [lo, hi) whose page is present and anonymous (a private copy, not the file's page)."""
    pagemap.seek(lo // 4096 * 8)
    entries = pagemap.read((hi - lo) // 4096 * 8)
    out = []
    for k, (entry,) in enumerate(struct.iter_unpack("Q", entries)):
        if entry >> 63 and not (entry >> 61) & 1:
            out.append(lo + k * 4096)
    return out


def _memory_hashes(host_pid: int) -> dict[str, str]:
    """A hash of every readable mapping's bytes, by range. A private mapping of a regular file is hashed by its
    pages of its own only (a relocated library's RELRO, say): its other pages are the file's, the same file on both
    sides (the maps compare names and offsets)."""
    out = {}
    wiped = _wipe_on_fork(host_pid)
    with open(f"/proc/{host_pid}/mem", "rb", buffering=0) as mem, \
            open(f"/proc/{host_pid}/pagemap", "rb", buffering=0) as pagemap:
        for start, end, perms, _, name in _maps(host_pid):
            if perms[0] != "r" or name in SKIPPED_MAPPINGS:
                continue
            if f"{start}-{end}" in wiped:
                # MADV_WIPEONFORK (BoringSSL's fork detection): a fork's child, and a clone, must find it zeroed
                mem.seek(int(start, 16))
                zero = not mem.read(int(end, 16) - int(start, 16)).strip(b"\0")
                out[f"{start}-{end}"] = WIPED_ZERO if zero else "wipe-on-fork, not zero"
                continue
            if name.startswith("/SYSV"):
                out[f"{start}-{end}"] = _segment_hash(host_pid, f"{start}-{end}")
                continue
            lo, hi = int(start, 16), int(end, 16)
            h = hashlib.blake2b(digest_size=16)
            file_backed = name.startswith("/") and not name.startswith("/memfd:") and perms[3] == "p"
            ranges = [(a, a + 4096) for a in _private_pages(pagemap, lo, hi)] if file_backed else [(lo, hi)]
            for a, b in ranges:
                at = a
                h.update(f"{a:x}".encode())
                try:
                    while at < b:
                        mem.seek(at)
                        chunk = mem.read(min(b - at, 1 << 20))
                        if not chunk:
                            break
                        h.update(chunk)
                        at += len(chunk)
                except OSError as e:
                    h.update(f"unreadable at {at:x}: {e.errno}".encode())
            out[f"{start}-{end}"] = h.hexdigest()
    return out


def _segment_hash(host_pid: int, where: str) -> str:
    """A hash of a SysV segment's pages that hold anything, by offset, read from its shmem file (not through the
    mapping: reading a hole of it there would fill it, and X's MIT-SHM segments are mostly holes). A page of zeros
    is a hole's equal, whichever side has it allocated."""
    h = hashlib.blake2b(digest_size=16)
    fd = os.open(f"/proc/{host_pid}/map_files/{where}", os.O_RDONLY)
    try:
        size, data = os.fstat(fd).st_size, 0
        while data < size:
            try:
                data = os.lseek(fd, data, os.SEEK_DATA)
            except OSError:  # ENXIO: no data after it
                break
            hole = os.lseek(fd, data, os.SEEK_HOLE)
            for page in range(data - data % 4096, hole, 4096):
                chunk = os.pread(fd, 4096, page)
                if chunk.strip(b"\0"):
                    h.update(f"{page:x}".encode() + chunk)
            data = hole
    finally:
        os.close(fd)
    return h.hexdigest()


# the calls that run with a temporary signal mask, by x86-64 number: rt_sigsuspend, pselect6, ppoll, epoll_pwait,
# epoll_pwait2
MASK_CALLS = {130: "rt_sigsuspend", 270: "pselect6", 271: "ppoll", 281: "epoll_pwait", 441: "epoll_pwait2"}


def _mask_call(host_pid: int) -> str:
    """The call a process's main thread waits in with a temporary signal mask, or ""."""
    try:
        words = Path(f"/proc/{host_pid}/syscall").read_text().split()
    except OSError:
        return ""
    return MASK_CALLS.get(int(words[0]), "") if words and words[0].lstrip("-").isdigit() else ""


def memory_difference(source_pid: int, clone_pid: int, where: str) -> str:
    """Where two processes' mapping ``where`` (START-END) first differs, with the bytes around it on each side and
    what maps it (to say why a "contents differ" is what it is)."""
    lo, hi = (int(x, 16) for x in where.split("-"))
    name = next((f"{perms} {n or '[anonymous]'}" for s, e, perms, _, n in _maps(source_pid) if f"{s}-{e}" == where),
                "?")
    with open(f"/proc/{source_pid}/mem", "rb", buffering=0) as a, open(f"/proc/{clone_pid}/mem", "rb",
                                                                        buffering=0) as b:
        for page in range(lo, hi, 4096):
            a.seek(page)
            b.seek(page)
            x, y = a.read(4096), b.read(4096)
            if x != y:
                at = next(i for i in range(min(len(x), len(y))) if x[i] != y[i]) if len(x) == len(y) else 0
                count = sum(1 for i in range(min(len(x), len(y))) if x[i] != y[i])
                return (f"{where} ({name}): {count} bytes differ in page {page:x}, the first at +{at:#x}: source "
                        f"{x[at:at + 16].hex()} clone {y[at:at + 16].hex()}")
    return f"{where} ({name}): no byte differs now"


def _mounts(host_pid: int, root: str) -> list[tuple[str, str]]:
    out = []
    for line in Path(f"/proc/{host_pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        mount_point = fields[4]
        fstype = fields[fields.index("-") + 1]
        out.append((mount_point, fstype))
    del root
    return sorted(out)


def describe(init_host_pid: int) -> dict[int, dict[str, object]]:
    """What a frozen tree shows of itself, by pid in its own namespace, normalised for comparison."""
    root = os.readlink(f"/proc/{init_host_pid}/root")
    root = "" if root == "/" else root
    names: dict[str, str] = {}
    unix = unix_sockets(init_host_pid)
    netlink = netlink_sockets(init_host_pid)
    view: dict[int, dict[str, object]] = {}
    ns_of: dict[int, int] = {}
    ttys: dict[int, tuple[int, ...]] = {}  # tty_nr and tpgid (a host pid), by pid
    for host_pid in walk(init_host_pid):
        st = status(host_pid)
        pid = last(st["NSpid"])
        ns_of[host_pid] = pid
        if st["State"].startswith("Z"):
            fields = Path(f"/proc/{host_pid}/stat").read_text().rsplit(")", 1)[1].split()
            view[pid] = {"ppid": ns_of.get(int(st["PPid"]), 0), "sid": last(st["NSsid"]),
                         "pgid": last(st["NSpgid"]), "comm": st["Name"], "zombie": fields[49],
                         "fds": {}, "maps": [], "memory": {}}
            continue
        threads = sorted(last(status(host_pid, int(t))["NSpid"]) for t in os.listdir(f"/proc/{host_pid}/task"))
        fds = {int(n): _fd_view(host_pid, int(n), root, names, unix, netlink)
               for n in sorted(os.listdir(f"/proc/{host_pid}/fd"), key=int)}
        view[pid] = {
            "ppid": ns_of.get(int(st["PPid"]), 0), "sid": last(st["NSsid"]), "pgid": last(st["NSpgid"]),
            "comm": st["Name"], "uid": st["Uid"], "gid": st["Gid"], "groups": st["Groups"],
            "sigblk": st["SigBlk"], "mask_call": _mask_call(host_pid), "sigign": st["SigIgn"], "sigcgt": st["SigCgt"],
            "threads": threads, "cwd": inside(os.readlink(f"/proc/{host_pid}/cwd"), root, f"pid {pid}"),
            "fds": fds, "maps": _maps(host_pid), "root": root, "memory": _memory_hashes(host_pid),
            "mounts": _mounts(host_pid, root), "cgroup": cgroup_below(host_pid, init_host_pid, f"pid {pid}"),
        }
        if last(st["NSsid"]):  # a session of the tree's: its controlling terminal and that one's foreground group
            ttys[pid] = tuple(int(x) for x in Path(f"/proc/{host_pid}/stat").read_text().rsplit(")", 1)[1].split()[4:6])
    for pid, (tty_nr, tpgid) in ttys.items():
        view[pid]["tty"] = (terminals.controlling_tty(tty_nr), ns_of.get(tpgid, tpgid if tpgid <= 0 else "outside"))
    ipc = read_ipc(init_host_pid)
    if not ipc.ours:  # the tree's own SysV objects: the same ids, keys, modes, sizes, owners and attach counts
        view[1]["ipc"] = (sorted(ipc.segments.values(), key=lambda g: g.shmid), ipc.semaphores, ipc.queues)
    return view


def compare(source: dict[int, dict[str, object]], clone: dict[int, dict[str, object]],
            inherited: frozenset[tuple[int, int]] = frozenset()) -> list[str]:
    """Every difference between two descriptions, as a sentence (empty: the clone is faithful). ``inherited``
    descriptors, (pid, number), are the caller's in the clone (``read_tree``'s ``inherit``): not compared."""
    out = []
    if sorted(source) != sorted(clone):
        return [f"processes differ: source {sorted(source)}, clone {sorted(clone)}"]
    for pid in sorted(source):
        s, c = source[pid], clone[pid]
        for key in s:
            if key in ("fds", "memory", "maps", "root", "mask_call") or (key == "sigblk" and s["mask_call"]):
                # a source waiting in ppoll() (say) shows its temporary mask; the clone has the saved one and
                # restarts the call, which sets the temporary one again
                continue
            if s[key] != c.get(key):
                out.append(f"pid {pid} {key}: source {s[key]!r}, clone {c.get(key)!r}")
        sf, cf = s["fds"], c["fds"]
        assert isinstance(sf, dict) and isinstance(cf, dict)
        for num in sorted(set(sf) | set(cf)):
            if sf.get(num) != cf.get(num) and (pid, num) not in inherited:
                out.append(f"pid {pid} fd {num}: source {sf.get(num)!r}, clone {cf.get(num)!r}")
        roots = (str(s.get("root", "")), str(c.get("root", "")))
        sm, cm = _inside_roots(s["maps"], roots), _inside_roots(c["maps"], roots)
        if sm != cm:
            out.append(f"pid {pid} maps: only in source {sorted(sm - cm)[:4]}, only in clone {sorted(cm - sm)[:4]}")
        sh, ch = s["memory"], c["memory"]
        assert isinstance(sh, dict) and isinstance(ch, dict)
        for where in sorted(set(sh) | set(ch)):
            if str(sh.get(where, "")).startswith("wipe-on-fork") and ch.get(where) == WIPED_ZERO:
                continue  # the source's is what it wrote; the clone's must be zero, as a fork child's is
            if sh.get(where) != ch.get(where):
                out.append(f"pid {pid} memory {where}: contents differ")
    return out


def pagemap_frame(host_pid: int, address: int) -> int:
    """The page frame backing ``address`` in ``host_pid`` (-1: not present)."""
    with open(f"/proc/{host_pid}/pagemap", "rb") as f:
        f.seek(address // 4096 * 8)
        entry = struct.unpack("Q", f.read(8))[0]
    return entry & ((1 << 55) - 1) if entry >> 63 else -1


def diverge(source_pid: int, clone_pid: int, pages_per_mapping: int = 4) -> tuple[list[str], int, int]:
    """Write a byte into private pages of each side in turn and check the other never sees it (the byte is put
    back after). Return the failures, the pages tried, and how many of them shared a frame before the write."""
    failures, tried, shared = [], 0, 0
    with open(f"/proc/{source_pid}/mem", "r+b", buffering=0) as smem, \
            open(f"/proc/{clone_pid}/mem", "r+b", buffering=0) as cmem:
        for start, end, perms, _, name in _maps(source_pid):
            # private pages, and those of SysV segments (shared, but each side's is its own copy)
            if perms[:2] != "rw" or (perms[3] != "p" and not name.startswith("/SYSV")) or name in SKIPPED_MAPPINGS:
                continue
            lo, hi = int(start, 16), int(end, 16)
            npages = (hi - lo) // 4096
            for k in range(min(pages_per_mapping, npages)):
                address = lo + (k * npages // pages_per_mapping) * 4096
                frame = pagemap_frame(source_pid, address)
                shared += frame >= 0 and frame == pagemap_frame(clone_pid, address)
                tried += 1
                for writer, reader, label in ((cmem, smem, "clone"), (smem, cmem, "source")):
                    writer.seek(address)
                    before = writer.read(1)
                    reader.seek(address)
                    theirs = reader.read(1)
                    writer.seek(address)
                    writer.write(bytes([before[0] ^ 0xFF]))
                    reader.seek(address)
                    if reader.read(1) != theirs:
                        failures.append(f"{name or 'anonymous'} {address:x}: a write by the {label} was seen "
                                        "by the other side")
                    writer.seek(address)
                    writer.write(before)
    return failures, tried, shared

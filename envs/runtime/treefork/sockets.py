"""What the kernel says of a process tree's Unix sockets (``NETLINK_SOCK_DIAG``, asked from inside the tree's network
namespace): each socket's type, state, bound name, peer, pending connections and queued bytes, by inode; and of its
netlink sockets (``/proc/PID/net/netlink``): protocol, port id, groups and queued bytes.

Owns: ``in_network_namespace`` (work on a thread inside a tree's network namespace), ``unix_sockets`` (one dump of a network namespace's Unix sockets) and ``UnixSocket``; ``netlink_sockets`` and
``NetlinkSocket``. Which of them a clone can have again, and how, is ``reader.py``'s.
Must never: change the namespace of the calling thread (the dump is asked from a thread of its own).
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from .. import syscalls
from .procfs import in_namespace_of

T = TypeVar("T")
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
UDIAG_SHOW_NAME, UDIAG_SHOW_PEER, UDIAG_SHOW_ICONS, UDIAG_SHOW_RQLEN = 0x1, 0x4, 0x8, 0x10
UNIX_DIAG_NAME, UNIX_DIAG_PEER, UNIX_DIAG_ICONS, UNIX_DIAG_RQLEN = 0, 2, 3, 4
LISTEN, ESTABLISHED, UNCONNECTED = 10, 1, 7  # the TCP state numbers the kernel reuses for Unix sockets
TYPES: dict[int, str] = {int(socket.SOCK_STREAM): "stream", int(socket.SOCK_DGRAM): "dgram",
                         int(socket.SOCK_SEQPACKET): "seqpacket"}


@dataclass
class UnixSocket:
    inode: int
    type: int  # socket.SOCK_STREAM, SOCK_DGRAM or SOCK_SEQPACKET
    state: int  # LISTEN, ESTABLISHED or UNCONNECTED
    name: str = ""  # bound path, "@name" for an abstract one, "" unbound
    peer: int = 0  # the peer's inode (0: none)
    pending: list[int] = field(default_factory=list)  # a listener's connections not yet accepted
    queued: int = 0  # bytes in its receive queue (a listener: connections)

    @property
    def kind(self) -> str:
        return TYPES.get(self.type, f"type {self.type}")


@dataclass(frozen=True)
class NetlinkSocket:
    inode: int
    protocol: int  # NETLINK_ROUTE, NETLINK_KOBJECT_UEVENT, ...
    port: int  # its port id (0: not bound)
    groups: int  # the multicast groups it joined (the first 32, as /proc shows them)
    queued: int  # bytes in its receive queue


def netlink_sockets(host_pid: int) -> dict[int, NetlinkSocket]:
    """Every netlink socket of the network namespace of ``host_pid``, by inode."""
    out = {}
    for line in Path(f"/proc/{host_pid}/net/netlink").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 10:
            out[int(fields[9])] = NetlinkSocket(inode=int(fields[9]), protocol=int(fields[1]), port=int(fields[2]),
                                                groups=int(fields[3], 16), queued=int(fields[4]))
    return out


def _dump(sock: socket.socket) -> dict[int, UnixSocket]:
    show = UDIAG_SHOW_NAME | UDIAG_SHOW_PEER | UDIAG_SHOW_ICONS | UDIAG_SHOW_RQLEN
    req = struct.pack("=BBHIIIII", socket.AF_UNIX, 0, 0, 0xFFFFFFFF, 0, show, 0xFFFFFFFF, 0xFFFFFFFF)
    sock.send(struct.pack("=IHHII", 16 + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + req)
    out: dict[int, UnixSocket] = {}
    while True:
        data = sock.recv(1 << 20)
        at = 0
        while at + 16 <= len(data):
            length, kind = struct.unpack_from("=IH", data, at)
            if kind == NLMSG_DONE:
                return out
            if kind == NLMSG_ERROR:
                err = -struct.unpack_from("=i", data, at + 16)[0]
                raise OSError(err, f"sock_diag: {os.strerror(err)}")
            family, stype, state, _, inode = struct.unpack_from("=BBBBI", data, at + 16)
            entry = UnixSocket(inode=inode, type=stype, state=state)
            attr = at + 16 + 16
            while attr + 4 <= at + length:
                alen, atype = struct.unpack_from("=HH", data, attr)
                payload = data[attr + 4:attr + alen]
                if atype == UNIX_DIAG_NAME:
                    entry.name = "@" + payload[1:].decode(errors="replace") if payload[:1] == b"\0" \
                        else payload.rstrip(b"\0").decode(errors="replace")
                elif atype == UNIX_DIAG_PEER:
                    entry.peer = struct.unpack("=I", payload[:4])[0]
                elif atype == UNIX_DIAG_ICONS:
                    entry.pending = list(struct.unpack(f"={len(payload) // 4}I", payload[:len(payload) // 4 * 4]))
                elif atype == UNIX_DIAG_RQLEN:
                    entry.queued = struct.unpack("=II", payload[:8])[0]
                attr += (alen + 3) & ~3
            if family == socket.AF_UNIX:
                out[inode] = entry
            at += (length + 3) & ~3


def in_network_namespace(host_pid: int, work: Callable[[], T], timeout: float | None = None) -> T:
    """``work()``'s result, run on a thread of its own that entered the network namespace of ``host_pid`` (the
    calling thread's stays as it is); its exception is raised here, and TimeoutError after ``timeout`` seconds."""
    return in_namespace_of(host_pid, "net", syscalls.CLONE_NEWNET, work, timeout)


def unix_sockets(host_pid: int) -> dict[int, UnixSocket]:
    """Every Unix socket of the network namespace of ``host_pid``, by inode."""
    def dump() -> dict[int, UnixSocket]:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as sock:
            return _dump(sock)

    return in_network_namespace(host_pid, dump)

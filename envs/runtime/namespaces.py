"""Namespaces of a workspace: entering fresh ones, the loopback-only network, the hostname, the PID namespace
that agent commands run in.

Owns: which namespaces a workspace gets and the order they are entered in. Workspace hosts stay in the engine's
PID namespace (so a fork of a fork never nests PID namespaces, whatever the chain's depth); each workspace's agent
commands run in a PID namespace of their own, one level below, created afresh by every clone. See docs/fork.md.
Must never: be called from the engine process itself (it changes the caller's namespaces).
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct

from . import syscalls

WORKSPACE_NAMESPACES = syscalls.CLONE_NEWNS | syscalls.CLONE_NEWNET | syscalls.CLONE_NEWUTS | syscalls.CLONE_NEWIPC
SHELL_NAMESPACES = WORKSPACE_NAMESPACES & ~syscalls.CLONE_NEWNS  # what a prepared shell makes ahead (``shells.py``)

_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1


def enter_new_workspace_namespaces(hostname: str, network_of: int | None = None, shell: int | None = None) -> None:
    """Fresh mount, network, UTS and IPC namespaces for the caller; mounts stop propagating to the host.
    ``network_of``: a pidfd of a warm-pool slot's host, whose network namespace the caller enters instead of a
    fresh one (the browser the slot started lives in it). ``shell``: a pidfd of a prepared shell's holder, whose
    network (loopback up), UTS and IPC namespaces the caller enters: only the mount namespace is made here."""
    if shell is not None:
        syscalls.unshare(syscalls.CLONE_NEWNS)
        syscalls.setns(shell, SHELL_NAMESPACES)
    elif network_of is None:
        syscalls.unshare(WORKSPACE_NAMESPACES)
    else:
        syscalls.unshare(WORKSPACE_NAMESPACES & ~syscalls.CLONE_NEWNET)
        syscalls.setns(network_of, syscalls.CLONE_NEWNET)
    syscalls.mount(None, "/", None, syscalls.MS_REC | syscalls.MS_PRIVATE)
    syscalls.sethostname(hostname)


def make_shell_namespaces(hostname: str) -> None:
    """A prepared shell's holder: fresh network, UTS and IPC namespaces, named ``hostname``, loopback up."""
    syscalls.unshare(SHELL_NAMESPACES)
    syscalls.sethostname(hostname)
    loopback_up()


def loopback_up() -> None:
    """Bring up ``lo``, the only interface a new network namespace has; there is no route off it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH", fcntl.ioctl(s, _SIOCGIFFLAGS, ifreq)[:18])[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | _IFF_UP, b""))


def open_ns(kind: str, pid: str = "self") -> int:
    return os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC)

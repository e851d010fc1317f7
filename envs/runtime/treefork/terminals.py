"""Ptys of a frozen tree: what a master's pair is (its index, its slave's termios and window size, packet mode, which
devpts instance it belongs to, whether bytes are in flight either way), which descriptors are slaves, and how a
process's controlling terminal (``/proc/PID/stat``'s ``tty_nr``) names one.

Owns: these readings, shared by ``reader.py`` (the plan and the refusals) and ``oracle.py`` (the comparison).
Must never: change a terminal: the master is read through a copy of the source's descriptor (pidfd_getfd), its
slave opened without becoming anyone's controlling terminal and without blocking; nothing is read from either queue.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from dataclasses import dataclass

from .. import syscalls
from .errors import TreeForkRefused
from .plan import Terminal

PTMX = (5, 2)  # /dev/ptmx and every devpts instance's ptmx
PTS_MAJORS = range(136, 144)  # UNIX98_PTY_SLAVE_MAJOR and the majors after it
TCGETS, TIOCGWINSZ, FIONREAD = 0x5401, 0x5413, 0x541B
TIOCGPTN, TIOCGPKT, TIOCGPTPEER = 0x80045430, 0x80045438, 0x5441
TERMIOS_SIZE = 36  # the kernel's struct termios on x86-64: four flags, the line discipline, 19 control characters


def is_master(st: os.stat_result) -> bool:
    return (os.major(st.st_rdev), os.minor(st.st_rdev)) == PTMX


def slave_index(rdev: int) -> int | None:
    """The index of the pty slave device ``rdev`` (/dev/pts/N), or None when it is not one."""
    major = os.major(rdev)
    return (major - PTS_MAJORS.start) * 256 + os.minor(rdev) if major in PTS_MAJORS else None


def controlling_tty(tty_nr: int) -> tuple[int, int]:
    """/proc/PID/stat's ``tty_nr`` as (major, minor) (0, 0: no controlling terminal)."""
    return (tty_nr >> 8) & 0xFFF, (tty_nr & 0xFF) | ((tty_nr >> 12) & 0xFFF00)


@dataclass(frozen=True)
class Master:
    terminal: Terminal
    devpts: int  # the st_dev of its slave: which devpts instance the pair belongs to
    queued_out: int  # what the slave's side wrote that the master has not read
    queued_in: int  # what the master wrote (typed) that the slave has not read


def _int(fd: int, request: int) -> int:
    return struct.unpack("i", fcntl.ioctl(fd, request, b"\0\0\0\0"))[0]


def read_master(host_pid: int, num: int, culprit: str) -> Master:
    """The pty whose master is descriptor ``num`` of process ``host_pid``. A master whose slave is still locked
    (never unlocked: nobody could have opened it), or whose devpts instance is not at /dev/pts beside the ptmx it
    was opened from (a mount over it since), is refused."""
    fd = syscalls.descriptor_of(host_pid, num)
    try:
        try:
            peer = fcntl.ioctl(fd, TIOCGPTPEER, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            if e.errno == errno.ENODEV:  # its devpts is no longer where it was opened from: the tree mounted another
                raise TreeForkRefused(culprit, "a pty master of a devpts instance other than the tree's /dev/pts") \
                    from e
            raise TreeForkRefused(culprit, f"a pty master whose slave cannot be opened ({e.strerror}: "
                                           "still locked?)") from e
        try:
            return Master(Terminal(index=_int(fd, TIOCGPTN), termios=fcntl.ioctl(fd, TCGETS, bytes(TERMIOS_SIZE)),
                                   winsize=fcntl.ioctl(fd, TIOCGWINSZ, bytes(8)), packet=bool(_int(fd, TIOCGPKT))),
                          devpts=os.fstat(peer).st_dev, queued_out=_int(fd, FIONREAD), queued_in=_int(peer, FIONREAD))
        finally:
            os.close(peer)
    finally:
        os.close(fd)


def devpts_of(init_host_pid: int) -> int | None:
    """The st_dev of the devpts instance at the tree's /dev/pts (None: it has none)."""
    try:
        return os.stat(f"/proc/{init_host_pid}/root/dev/pts").st_dev
    except FileNotFoundError:
        return None

"""Thin ctypes bindings for the Linux system calls the workspace runtime needs and Python's os module lacks.

Owns: mount(2), umount2(2), pivot_root(2), unshare(2), setns(2), sethostname(2), prctl(2), kcmp(2), glibc's mallopt(3)
and their flag constants. Every failure raises OSError with the errno and the call's arguments in the message.
Must never: hold state, or decide policy; callers compose these calls.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)

# clone/unshare flags (linux/sched.h)
CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

# mount flags (linux/mount.h)
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2

# prctl options
PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15  # the calling thread's name (``comm``, 15 bytes)
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_SET_MEMORY_MERGE = 67  # KSM may merge every anonymous page of the process (Linux 6.4), inherited
PR_GET_MEMORY_MERGE = 68

# mallopt parameters (glibc malloc.h)
M_MMAP_THRESHOLD = -3

_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
_libc.sethostname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
_libc.syscall.restype = ctypes.c_long

_SYS_PIVOT_ROOT = 155  # x86-64
_SYS_OPEN_TREE = 428
_SYS_PIDFD_GETFD = 438
_SYS_KCMP = 312
KCMP_FILE = 0
OPEN_TREE_CLONE = 1
AT_RECURSIVE = 0x8000
# None: the arguments are passed as they are, unchecked (the syscall number decides them); typeshed's stub of
# argtypes admits only a sequence of ctypes types
_libc.syscall.argtypes = None  # type: ignore[assignment]


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _b(value: str | bytes | None) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return os.fsencode(value)


def mount(source: str | None, target: str, fstype: str | None, flags: int = 0, data: str | None = None) -> None:
    _check(
        _libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data)),
        f"mount({source!r}, {target!r}, {fstype!r}, {flags:#x}, {data!r})",
    )


def umount(target: str, flags: int = 0) -> None:
    _check(_libc.umount2(_b(target), flags), f"umount2({target!r}, {flags})")


def pivot_root(new_root: str, put_old: str) -> None:
    _check(_libc.syscall(_SYS_PIVOT_ROOT, _b(new_root), _b(put_old)), f"pivot_root({new_root!r}, {put_old!r})")


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), f"unshare({flags:#x})")


def setns(fd: int, nstype: int = 0) -> None:
    _check(_libc.setns(fd, nstype), f"setns({fd}, {nstype:#x})")


def pidfd_getfd(pidfd: int, target_fd: int) -> int:
    """A copy (close-on-exec) of descriptor ``target_fd`` of the process ``pidfd`` refers to."""
    return _check(_libc.syscall(ctypes.c_long(_SYS_PIDFD_GETFD), ctypes.c_int(pidfd), ctypes.c_int(target_fd),
                                ctypes.c_uint(0)), f"pidfd_getfd({pidfd}, {target_fd})")


def descriptor_of(pid: int, target_fd: int) -> int:
    """A copy (close-on-exec) of descriptor ``target_fd`` of process ``pid`` (pidfd_open, then pidfd_getfd)."""
    pidfd = os.pidfd_open(pid)
    try:
        return pidfd_getfd(pidfd, target_fd)
    finally:
        os.close(pidfd)


def sethostname(name: str) -> None:
    raw = name.encode()
    _check(_libc.sethostname(raw, len(raw)), f"sethostname({name!r})")


def prctl(option: int, arg2: int = 0, arg3: int = 0, arg4: int = 0, arg5: int = 0) -> int:
    return _check(_libc.prctl(option, arg2, arg3, arg4, arg5), f"prctl({option}, {arg2})")


def mallopt(param: int, value: int) -> None:
    """glibc's mallopt(3): it returns 0 on error and sets no errno."""
    if _libc.mallopt(param, value) != 1:
        raise OSError(f"mallopt({param}, {value}) failed")


def open_tree_clone(path: str) -> int:
    """A detached copy of the mount tree at ``path`` (the root of an anonymous mount namespace), as a descriptor.

    Overlayfs accepts layers on such a mount from any mount namespace, which is what lets a workspace name the
    pool's layers after it has pivoted away from the host's mounts.
    """
    fd = _libc.syscall(ctypes.c_long(_SYS_OPEN_TREE), ctypes.c_int(-100), _b(path),
                       ctypes.c_uint(OPEN_TREE_CLONE | AT_RECURSIVE | os.O_CLOEXEC))
    return _check(fd, f"open_tree({path!r}, OPEN_TREE_CLONE|AT_RECURSIVE)")


def same_open_file(pid1: int, fd1: int, pid2: int, fd2: int) -> bool:
    """Whether descriptor ``fd1`` of ``pid1`` and ``fd2`` of ``pid2`` are one open file (kcmp ``KCMP_FILE``)."""
    ret = _libc.syscall(ctypes.c_long(_SYS_KCMP), ctypes.c_int(pid1), ctypes.c_int(pid2), ctypes.c_int(KCMP_FILE),
                        ctypes.c_ulong(fd1), ctypes.c_ulong(fd2))
    return _check(ret, f"kcmp({pid1}, {pid2}, KCMP_FILE, {fd1}, {fd2})") == 0


def open_by_handle_at(mount_fd: int, handle_type: int, handle: bytes, flags: int = os.O_PATH) -> int:
    """The file a file handle (``name_to_handle_at``'s, or what /proc's fdinfo shows of an inotify watch) names,
    looked up in the file system of ``mount_fd``, opened with ``flags`` (needs CAP_DAC_READ_SEARCH)."""
    buf = ctypes.create_string_buffer(struct.pack("=Ii", len(handle), handle_type) + handle)
    fd = _libc.open_by_handle_at(ctypes.c_int(mount_fd), buf, ctypes.c_int(flags | os.O_CLOEXEC))
    return _check(fd, f"open_by_handle_at({mount_fd}, type {handle_type})")

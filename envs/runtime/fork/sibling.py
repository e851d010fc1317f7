"""Forking a clone whose parent is the run's nursery: in one step, as the caller's sibling, where the caller is
itself the nursery's child; else in the classic two (fork, fork again, the middle process exits and the clone is
orphaned onto the nursery, a child subreaper).

Owns: ``fork_to_reaper``. One step is ``clone(CLONE_PARENT)``: the kernel makes the clone the child of our parent,
so the page tables are copied once and no middle process tears a second copy down while the source waits (at 1 GiB
in 4 KiB pages that teardown was most of the freeze). Around it CPython's own fork work runs as ``os.fork`` runs it
(``PyOS_BeforeFork``, ``PyOS_AfterFork_Child``/``_Parent``: the import lock, threads' state, ``os.register_at_fork``
hooks such as ``random``'s reseed), the GIL held throughout (``ctypes.PyDLL``), and the kernel writes the clone's
thread id into glibc's thread block (``CLONE_CHILD_SETTID`` at the address ``PR_GET_TID_ADDRESS`` reports, where
glibc's ``fork`` has it written). What it skips of glibc's ``fork``: C libraries' ``pthread_atfork`` handlers and
the locks glibc takes against other threads; so one step is taken only by a process glibc knows never started a
thread (``__libc_single_threaded``: OpenBLAS's pool, say, whose ``pthread_atfork`` handler joins its threads before
a fork and would wait forever for them in a clone made without it; hosts run BLAS on one thread, ``host.py``). Two steps
otherwise, or where the kernel refuses (no ``PR_GET_TID_ADDRESS`` without CONFIG_CHECKPOINT_RESTORE; an init
process may not use ``CLONE_PARENT``), or when the run asks for them (``HostConfig.one_step_clones``).
Must never: return in the clone before the interpreter's after-fork work has run.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
from typing import NamedTuple

_SYS_CLONE = 56  # x86-64
CLONE_PARENT = 0x00008000
CLONE_CHILD_CLEARTID = 0x00200000
CLONE_CHILD_SETTID = 0x01000000
PR_GET_TID_ADDRESS = 40


@functools.cache
def _tid_address() -> int | None:
    """Where glibc keeps this thread's id (the same address in every fork of the process); None if not told."""
    libc = ctypes.CDLL(None, use_errno=True)
    address = ctypes.c_void_p()
    if libc.prctl(PR_GET_TID_ADDRESS, ctypes.byref(address), 0, 0, 0) != 0 or not address.value:
        return None
    return address.value


@functools.cache
def _clone() -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    call = ctypes.PyDLL(None, use_errno=True).syscall  # PyDLL: the GIL stays held, as os.fork holds it
    call.restype = ctypes.c_long
    call.argtypes = [ctypes.c_long, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                     ctypes.c_ulong]
    return call


def one_step_possible(reaper_pid: int) -> bool:
    """Whether ``fork_to_reaper`` can take one step here: our parent is the nursery, no thread was ever started in
    this process (glibc's own flag), and glibc's thread-id address is known."""
    return os.getppid() == reaper_pid and _single_threaded() and _tid_address() is not None


@functools.cache
def _single_threaded_flag() -> ctypes.c_bool:
    """glibc's own flag (its address is the same in every fork of the process: looked up once)."""
    return ctypes.c_bool.in_dll(ctypes.CDLL(None), "__libc_single_threaded")


def _single_threaded() -> bool:
    return bool(_single_threaded_flag().value)


def fork_as_sibling() -> int:
    """``clone(CLONE_PARENT)`` with CPython's fork work around it: 0 in the clone, its pid here. OSError if the
    kernel refuses (nothing was made)."""
    tid_address = _tid_address()
    if tid_address is None:
        raise OSError(0, "the kernel does not report glibc's thread-id address (PR_GET_TID_ADDRESS)")
    api = ctypes.pythonapi
    flags = CLONE_PARENT | CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID | signal.SIGCHLD
    api.PyOS_BeforeFork()
    pid = _clone()(_SYS_CLONE, flags, None, None, tid_address, 0)
    if pid == 0:
        api.PyOS_AfterFork_Child()
        return 0
    err = ctypes.get_errno()
    api.PyOS_AfterFork_Parent()
    if pid < 0:
        raise OSError(err, f"clone(CLONE_PARENT): {os.strerror(err)}")
    return pid


class Forking(NamedTuple):
    """``fork_to_reaper``'s result: ``pid`` 0 in the clone; in the caller the clone's pid after one step, else the
    middle process's, which the caller reaps (status 0: it made the clone; 70: its fork failed) before it reads
    the clone's pid from ``report`` (``clone_pid``)."""

    pid: int
    one_step: bool
    report: int = -1


def fork_to_reaper(reaper_pid: int, *, one_step: bool = True) -> Forking:
    """A clone whose parent is the nursery ``reaper_pid``, in one step where it can be, else in two."""
    if one_step and one_step_possible(reaper_pid):
        try:
            return Forking(fork_as_sibling(), True)
        except OSError:
            pass  # refused (nothing made): two steps
    report, told = os.pipe()
    try:
        pid = os.fork()
    except BaseException:
        os.close(report)
        os.close(told)
        raise
    if pid != 0:
        os.close(told)
        return Forking(pid, False, report)
    os.close(report)
    try:  # the middle process: fork once more, tell the caller the clone's pid and go (the clone is orphaned)
        clone = os.fork()
        if clone != 0:
            os.write(told, clone.to_bytes(4, "little"))
            os._exit(0)
    except BaseException:
        os._exit(70)
    os.close(told)
    return Forking(0, False)


def clone_pid(forking: Forking) -> int:
    """The clone's pid, in the caller (after two steps, once the middle process is reaped: 0 if it made none)."""
    if forking.one_step:
        return forking.pid
    try:
        told = os.read(forking.report, 4)
    finally:
        os.close(forking.report)
    return int.from_bytes(told, "little") if len(told) == 4 else 0

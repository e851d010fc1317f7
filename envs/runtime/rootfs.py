"""Assembling a workspace's root file system inside its own mount namespace, then pivoting into it.

Owns: the overlay mount (image below, the workspace's writable layer above; a snapshot mounts its layer
read-only), the read-only bind mounts on top (the host's /usr for the default image, the runtime's interpreter),
a private /dev, and pivot_root. The caller's working directory must be the pool's root: overlay option paths are
relative to it, so a clone, whose root no longer shows the pool, can still name its layers.
Must never: run in the engine's mount namespace.
"""

from __future__ import annotations

import os

from . import syscalls
from .image import AGENT_GID, AGENT_HOME, AGENT_UID, CLONE_ROOT

RUNTIME_DIR = "/.bunshin-runtime"
_DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
_RO_BIND = syscalls.MS_BIND | syscalls.MS_REMOUNT | syscalls.MS_RDONLY | syscalls.MS_NOSUID | syscalls.MS_NODEV


def assemble_and_pivot(*, target: str, lower: str, layer: str, frozen: bool, image_binds: list[tuple[str, str]],
                       runtime_binds: list[str]) -> None:
    """Mount the new root at ``target`` (an empty directory in the current root) and make it ``/``.

    Bind sources are resolved in the *current* root, which for a first host is the host's and for a clone is its
    source's. ``image_binds`` are (source, path) pairs mounted at ``path``, for everyone to use: a first host
    names the image's directory (the host's /usr, a declared image's in the store), a clone names ``path`` itself,
    where its source has it. ``runtime_binds`` (the host interpreter and bunshin's
    sources, which the host may import from lazily) are mounted below RUNTIME_DIR, a directory only root can
    enter, and their own path becomes a symlink into it: the host finds its files where it left them, agents
    find a link they cannot follow.
    """
    assemble(target=target, lower=lower, layer=layer, frozen=frozen, image_binds=image_binds,
             runtime_binds=runtime_binds)
    os.chdir(target)
    syscalls.pivot_root(".", ".")
    syscalls.umount(".", syscalls.MNT_DETACH)
    os.chdir("/")


def assemble(*, target: str, lower: str, layer: str, frozen: bool, image_binds: list[tuple[str, str]],
             runtime_binds: list[str]) -> None:
    """Mount the root ``assemble_and_pivot`` makes ``/`` at ``target``, and nothing else: the tree fork's builder
    enters it itself (``fork/kmod.py``). The current directory must be the pool's root."""
    if frozen:
        data = f"lowerdir={layer}/upper:{lower}"
        flags = syscalls.MS_RDONLY
    else:
        data = f"lowerdir={lower},upperdir={layer}/upper,workdir={layer}/work"
        flags = 0
    syscalls.mount("overlay", target, "overlay", flags, data)
    for source, path in image_binds:
        _bind_readonly(source, target + path, create=not frozen)
    if not frozen:
        _ensure_skeleton(target)
        os.makedirs(target + RUNTIME_DIR, mode=0o700, exist_ok=True)
        os.chmod(target + RUNTIME_DIR, 0o700)
    for path in runtime_binds:
        _bind_readonly(path, target + RUNTIME_DIR + path, create=not frozen)
        if not frozen:
            _link_to_runtime(target, path)
    _mount_dev(target)  # a snapshot needs one too: its clones bind their device nodes from it


def _ensure_skeleton(target: str) -> None:
    """Directories the runtime mounts on or runs in; an image that lacks them gets them in its upper layer."""
    for path, mode in (("/proc", 0o555), ("/dev", 0o755), ("/tmp", 0o1777), (CLONE_ROOT, 0o700)):
        if not os.path.isdir(target + path):
            os.makedirs(target + path, exist_ok=True)
            os.chmod(target + path, mode)
    home = target + AGENT_HOME
    if not os.path.isdir(home):
        os.makedirs(home)
        os.chown(home, AGENT_UID, AGENT_GID)


def _bind_readonly(source: str, dest: str, create: bool) -> None:
    if create:
        os.makedirs(dest, exist_ok=True)
    syscalls.mount(source, dest, None, syscalls.MS_BIND | syscalls.MS_REC)
    syscalls.mount(None, dest, None, _RO_BIND)


def _link_to_runtime(target: str, path: str) -> None:
    link = target + path
    if os.path.islink(link):
        return
    if os.path.lexists(link):
        # The image has something there already; leave the image alone (the host can still import through
        # RUNTIME_DIR only if it never needs this path, which holds for stdlib and site-packages of a venv).
        return
    os.makedirs(os.path.dirname(link), exist_ok=True)
    os.symlink(RUNTIME_DIR + path, link)


def _mount_dev(target: str) -> None:
    dev = target + "/dev"
    syscalls.mount("tmpfs", dev, "tmpfs", syscalls.MS_NOSUID | syscalls.MS_NOEXEC, "mode=755,size=64k")
    for node in _DEV_NODES:
        if not os.path.exists(f"/dev/{node}"):
            continue
        open(f"{dev}/{node}", "w").close()
        syscalls.mount(f"/dev/{node}", f"{dev}/{node}", None, syscalls.MS_BIND)
    for name, dest in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                       ("stderr", "/proc/self/fd/2")):
        os.symlink(dest, f"{dev}/{name}")
    os.mkdir(f"{dev}/shm")
    syscalls.mount("tmpfs", f"{dev}/shm", "tmpfs", syscalls.MS_NOSUID | syscalls.MS_NODEV,
                   "mode=1777,size=64m")
    # terminals: a devpts instance of the workspace's own (its ptys are not the host's, nor another workspace's)
    os.mkdir(f"{dev}/pts")
    syscalls.mount("devpts", f"{dev}/pts", "devpts", syscalls.MS_NOSUID | syscalls.MS_NOEXEC,
                   "newinstance,ptmxmode=0666,mode=0620,max=256")
    os.symlink("pts/ptmx", f"{dev}/ptmx")


def mount_proc() -> None:
    """Mount /proc for the caller's PID namespace (called by the agent namespace's init)."""
    syscalls.mount("proc", "/proc", "proc", syscalls.MS_NOSUID | syscalls.MS_NODEV | syscalls.MS_NOEXEC)

"""Writable layers of workspace file systems, kept as btrfs subvolumes in a per-run pool.

Owns: the run's pool (a btrfs file system on a sparse loop file, mounted for the run and unmounted at its end),
creating a workspace's writable layer (``upper/`` and ``work/`` for overlayfs), snapshotting a layer in constant
time, and deleting layers. Why btrfs: a subvolume snapshot copies only the root of the file system tree, so
freezing a workspace's files costs ~3 ms whatever their size (measured on this project's machines), where
copying or reflinking costs time per file; layer stacking in overlayfs would need the *source* to remount under
its running processes. See docs/fork.md.
Also the pool's ``dumps/`` directory, a tmpfs: the private-restore baseline's process images live in memory, as
CRIU's images in a tmpfs or the page cache do (on the btrfs, writing them back to the loop file stalled every
exiting workspace: an overlay's unmount syncs its whole upper file system).
Must never: snapshot a layer whose workspace may be writing (the caller quiesces the workspace first).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import struct
import subprocess
from pathlib import Path

from ..errors import HostUnsupported
from . import syscalls

DUMPS = "dumps"  # the pool's tmpfs for process images (``fork/restore.py``)
_BTRFS_IOCTL_MAGIC = 0x94
_VOL_ARGS_V2_SIZE = 4096
_VOL_ARGS_SIZE = 4096
_NAME_OFFSET_V2 = 56  # fd, transid, flags, 32-byte union; then name[4040]
BTRFS_SUBVOL_RDONLY = 1 << 1


def _iow(nr: int, size: int) -> int:
    return (1 << 30) | (size << 16) | (_BTRFS_IOCTL_MAGIC << 8) | nr


_IOC_SNAP_CREATE_V2 = _iow(23, _VOL_ARGS_V2_SIZE)
_IOC_SUBVOL_CREATE = _iow(14, _VOL_ARGS_SIZE)
_IOC_SNAP_DESTROY = _iow(15, _VOL_ARGS_SIZE)


def _check_name(name: str) -> bytes:
    raw = name.encode()
    if not raw or b"/" in raw or raw in (b".", b"..") or len(raw) >= 4000:
        raise ValueError(f"bad layer name {name!r}")
    return raw


def snapshot_at(pool_fd: int, src_fd: int, name: str, readonly: bool = False) -> None:
    """Snapshot the subvolume open as ``src_fd`` to ``name`` inside the directory ``pool_fd``."""
    args = bytearray(_VOL_ARGS_V2_SIZE)
    struct.pack_into("qQQ", args, 0, src_fd, 0, BTRFS_SUBVOL_RDONLY if readonly else 0)
    raw = _check_name(name)
    args[_NAME_OFFSET_V2 : _NAME_OFFSET_V2 + len(raw)] = raw
    fcntl.ioctl(pool_fd, _IOC_SNAP_CREATE_V2, args)


def _vol_args(name: str) -> bytearray:
    args = bytearray(_VOL_ARGS_SIZE)
    raw = _check_name(name)
    args[8 : 8 + len(raw)] = raw
    return args


class LayerStore:
    """The run's pool of layers. ``root`` is a directory on btrfs; each layer is one subvolume in it."""

    def __init__(self, root: Path, image_file: Path | None = None):
        self.root = root
        self.image_file = image_file

    @classmethod
    def create_pool(cls, run_dir: Path, size_bytes: int = 64 << 30) -> LayerStore:
        """Make a sparse btrfs image in ``run_dir`` and mount it at ``run_dir/pool`` (auto-cleared loop)."""
        if shutil.which("mkfs.btrfs") is None:
            raise LayersUnavailable("mkfs.btrfs not found (Debian package btrfs-progs)")
        image = run_dir / "pool.img"
        mnt = run_dir / "pool"
        mnt.mkdir(parents=True, exist_ok=True)
        with open(image, "wb") as f:
            f.truncate(size_bytes)
        _run(["mkfs.btrfs", "-q", "-f", "-m", "single", "-d", "single", str(image)])
        _run(["mount", "-t", "btrfs", "-o", "loop,noatime", str(image), str(mnt)])
        (mnt / DUMPS).mkdir()
        syscalls.mount("tmpfs", str(mnt / DUMPS), "tmpfs", syscalls.MS_NOSUID | syscalls.MS_NODEV | syscalls.MS_NOEXEC,
                       "mode=700")
        return cls(mnt, image)

    def destroy_pool(self) -> None:
        """Unmount (lazily, so late references cannot block us; the dumps' tmpfs goes with it) and delete the
        pool image."""
        with contextlib.suppress(OSError):
            syscalls.umount(str(self.root), syscalls.MNT_DETACH)
        if self.image_file is not None:
            self.image_file.unlink(missing_ok=True)

    def open_root(self) -> int:
        return os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def open_detached(self) -> int:
        """The pool as a detached mount: the descriptor hosts use to name layers from inside any workspace.

        It is an O_PATH descriptor, and the detached tree lives exactly as long as some process holds it open
        (the engine and every host do); ioctls need an ordinary descriptor opened through it.
        """
        return syscalls.open_tree_clone(str(self.root))

    def path(self, name: str) -> Path:
        return self.root / name

    def create(self, name: str) -> Path:
        """A new empty writable layer with overlayfs's ``upper`` and ``work`` directories."""
        fd = self.open_root()
        try:
            fcntl.ioctl(fd, _IOC_SUBVOL_CREATE, _vol_args(name))
        finally:
            os.close(fd)
        layer = self.path(name)
        (layer / "upper").mkdir()
        (layer / "work").mkdir()
        return layer

    def snapshot(self, src: str, name: str, readonly: bool = False) -> Path:
        pool_fd = self.open_root()
        src_fd = os.open(self.path(src), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            snapshot_at(pool_fd, src_fd, name, readonly)
        finally:
            os.close(src_fd)
            os.close(pool_fd)
        return self.path(name)

    def delete(self, name: str) -> None:
        if not self.path(name).exists():
            return
        fd = self.open_root()
        try:
            fcntl.ioctl(fd, _IOC_SNAP_DESTROY, _vol_args(name))
        finally:
            os.close(fd)


class LayersUnavailable(HostUnsupported):
    pass


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise LayersUnavailable(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")

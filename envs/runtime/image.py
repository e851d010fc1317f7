"""Base images: the read-only bottom layer of every workspace's root file system.

Owns: placing an image in the run's pool: a declared image built in the image store (``envs/images``: everything
but its /usr copied into the pool, its /usr bind-mounted read-only from the store), an image directory or tarball
a user gives, or the host-derived default (a skeleton with a minimal /etc and Debian's merged-/usr links, onto which
the host's /usr is bind-mounted); adding the agent's user; the list of bind mounts a workspace needs, including
the runtime's own Python installation (which rootfs.py hides from agents).
Must never: expose a host directory to agent commands beyond an image's /usr and the runtime's own interpreter
and sources.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import EnvsError
from ..images.docker_roots import ImageConfig
from ..images.store import BuiltImage

AGENT_USER = "agent"
AGENT_UID = 65000
AGENT_GID = 65000
AGENT_HOME = "/home/agent"
CLONE_ROOT = "/.bunshin"  # empty directory in every root, where a clone mounts its new root before pivoting



@dataclass(frozen=True)
class Bind:
    """A read-only bind mount into the workspace: ``source`` as the host sees it (None: the same path), mounted at
    ``path`` inside."""

    path: str
    source: str | None = None

    def pair(self) -> tuple[str, str]:
        """(source, path) as a first host mounts it; a clone mounts (path, path) from its source's root."""
        return (self.source or self.path, self.path)


@dataclass(frozen=True)
class PreparedImage:
    """An image ready for overlayfs: ``lower`` is relative to the pool root; ``binds`` go on top of the root."""

    name: str
    lower: str
    binds: tuple[Bind, ...] = field(default=())
    config: ImageConfig | None = None  # a Docker image's own configuration (its Env, WorkingDir, User...)


def runtime_paths() -> list[str]:
    """Host directories the workspace host's interpreter may import from (minimal cover, none under /usr):
    the interpreter's prefixes, its site-packages, and the tree bunshin's own sources live in. Other entries of
    ``sys.path`` (a script's directory, say) are not exposed; an app must be importable from these."""
    import site

    import bunshin.envs

    candidates = {sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(bunshin.envs.__file__).parent.parent)}
    candidates.update(p for p in site.getsitepackages() if os.path.isdir(p))
    real = sorted({os.path.realpath(p) for p in candidates})
    cover: list[str] = []
    for p in real:
        if p == "/" or p == "/usr" or p.startswith("/usr/"):
            continue
        if any(p == c or p.startswith(c + "/") for c in cover):
            continue
        cover.append(p)
    return cover


def build_default_image(pool_root: Path, name: str = "image-host") -> PreparedImage:
    """Skeleton root for the host-derived image: merged-/usr links, minimal /etc, empty mount points."""
    root = pool_root / name
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(mode=0o755)
    for link, target in (("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"),
                         ("lib32", "usr/lib32"), ("libx32", "usr/libx32")):
        if os.path.lexists(f"/{link}"):
            os.symlink(target, root / link)
    for d, mode in (("usr", 0o755), ("proc", 0o555), ("dev", 0o755), ("sys", 0o555), ("tmp", 0o1777),
                    ("var", 0o755), ("var/tmp", 0o1777), ("run", 0o755), ("root", 0o700), ("home", 0o755),
                    ("etc", 0o755), ("mnt", 0o755), ("opt", 0o755), (CLONE_ROOT.lstrip("/"), 0o700)):
        (root / d).mkdir(mode=mode, exist_ok=True)
        os.chmod(root / d, mode)
    etc = root / "etc"
    (etc / "passwd").write_text("")
    (etc / "group").write_text("")
    add_agent_user(root)
    (etc / "hosts").write_text("127.0.0.1\tlocalhost\n::1\tlocalhost\n")
    (etc / "resolv.conf").write_text("")
    (etc / "nsswitch.conf").write_text("passwd: files\ngroup: files\nhosts: files\n")
    for name_ in ("os-release", "ld.so.cache", "ld.so.conf", "debian_version", "profile", "bash.bashrc",
                  "inputrc", "mime.types", "localtime", "timezone"):
        src = Path("/etc") / name_
        if src.exists():
            shutil.copy2(src, etc / name_, follow_symlinks=True)
    # fonts: fontconfig's configuration and the cache built for the fonts under /usr (a browser started without
    # the cache builds it first, which costs each start about a second)
    for tree in ("alternatives", "ld.so.conf.d", "ssl", "python3", "python3.11", "fonts", "/var/cache/fontconfig"):
        src = Path("/etc") / tree
        if src.is_dir():
            shutil.copytree(src, root / src.relative_to("/"), symlinks=True)
    return PreparedImage(name=name, lower=name, binds=(Bind("/usr"),))


# what a declared image keeps out of the pool: /usr stays in the store (bound read-only), the kernel's file
# systems and /boot are nobody's
_NOT_PLACED = frozenset({"usr", "proc", "sys", "dev", "boot"})


def place_declared(pool_root: Path, built: BuiltImage) -> PreparedImage:
    """A declared image in the run's pool (``place_root``), named by its store directory."""
    return place_root(pool_root, built.root, key=built.path.name, label=f"image {built.name}")


def place_root(pool_root: Path, root: Path, *, key: str, label: str) -> PreparedImage:
    """A root file system kept outside the run (a declared image's in the store, a Docker image's in its cache) in
    the run's pool: everything but /usr copied (its /etc and /var, a few tens of MiB), with the agent's user added
    and no name server; /usr bound read-only from where it stays. ``key`` names it in the pool and makes its machine
    id (the same in every run and on every host)."""
    name = f"image-{key}"
    dest = pool_root / name
    dest.mkdir(mode=0o755)
    sources = [str(entry) for entry in sorted(root.iterdir()) if entry.name not in _NOT_PLACED]
    proc = subprocess.run(["cp", "-a", "--reflink=auto", *sources, str(dest)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ImageError(f"{label}: copy into the pool failed: {proc.stderr.strip()}")
    for d, mode in (("usr", 0o755), ("proc", 0o555), ("dev", 0o755), ("sys", 0o555), ("home", 0o755),
                    (CLONE_ROOT.lstrip("/"), 0o700)):
        (dest / d).mkdir(mode=mode, exist_ok=True)
    etc = dest / "etc"
    etc.mkdir(mode=0o755, exist_ok=True)
    (etc / "hosts").write_text("127.0.0.1\tlocalhost\n::1\tlocalhost\n")
    (etc / "resolv.conf").unlink(missing_ok=True)
    (etc / "resolv.conf").write_text("")  # workspaces have no network beyond their own loopback
    # D-Bus refuses to start without a machine id; one per image, the same in every run and on every host
    (etc / "machine-id").write_text(hashlib.sha256(key.encode()).hexdigest()[:32] + "\n")
    add_agent_user(dest)
    binds = (Bind("/usr", source=str(root / "usr")),) if (root / "usr").is_dir() else ()
    return PreparedImage(name=name, lower=name, binds=binds)


def add_agent_user(root: Path) -> None:
    """The agent's user and group (uid and gid AGENT_UID), root's and nobody's where missing, and its home."""
    etc = root / "etc"
    for file, lines in (("passwd", (("root", "root:x:0:0:root:/root:/bin/bash"),
                                    (AGENT_USER, f"{AGENT_USER}:x:{AGENT_UID}:{AGENT_GID}:agent:{AGENT_HOME}:/bin/bash"),
                                    ("nobody", "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin"))),
                        ("group", (("root", "root:x:0:"), (AGENT_USER, f"{AGENT_USER}:x:{AGENT_GID}:"),
                                   ("nogroup", "nogroup:x:65534:")))):
        path = etc / file
        text = path.read_text() if path.exists() else ""
        names = {line.split(":", 1)[0] for line in text.splitlines()}
        missing = [line for user, line in lines if user not in names]
        if missing:
            path.write_text(text + ("" if not text or text.endswith("\n") else "\n") + "\n".join(missing) + "\n")
    home = root / AGENT_HOME.lstrip("/")
    home.mkdir(parents=True, exist_ok=True)
    os.chown(home, AGENT_UID, AGENT_GID)


def place_tarball(pool_root: Path, tarball: Path) -> PreparedImage:
    digest = hashlib.sha256(str(tarball.resolve()).encode()).hexdigest()[:12]
    name = f"image-tar-{digest}"
    dest = pool_root / name
    dest.mkdir()
    proc = subprocess.run(["tar", "--numeric-owner", "-xpf", str(tarball), "-C", str(dest)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise ImageError(f"image tarball {tarball}: tar failed: {proc.stderr.strip()}")
    _check_rootfs(dest, str(tarball))
    (dest / CLONE_ROOT.lstrip("/")).mkdir(mode=0o700, exist_ok=True)
    return PreparedImage(name=name, lower=name)


def place_directory(pool_root: Path, directory: Path) -> PreparedImage:
    """Copy the image directory into the pool, once per run (reflinks where the file systems allow).

    Why a copy: overlayfs takes layers from another mount namespace only at the root of a detached mount, and
    the pool's detached copy is the one tree every workspace can name; a bind mount inside it would not do.
    """
    _check_rootfs(directory, str(directory))
    digest = hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:12]
    name = f"image-dir-{digest}"
    dest = pool_root / name
    proc = subprocess.run(["cp", "-a", "--reflink=auto", f"{directory}/.", str(dest)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise ImageError(f"image {directory}: copy failed: {proc.stderr.strip()}")
    return PreparedImage(name=name, lower=name)


def _check_rootfs(path: Path, label: str) -> None:
    if not path.is_dir():
        raise ImageError(f"image {label}: not a directory")
    if not (path / "bin").exists() and not (path / "usr" / "bin").exists():
        raise ImageError(f"image {label}: no bin/ or usr/bin/ (is it a root file system?)")


class ImageError(EnvsError, ValueError):
    pass

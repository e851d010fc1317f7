"""The image store: declared workspace images built from the Debian archive and cached by their recipe's digest.

Owns: building an image (``mmdebstrap`` in a private mount namespace, so its mounts of /proc and /dev die with it,
under a deadline, with progress), the cache directory ``<store>/<name>-<digest>/`` (``root/`` and
``manifest.json``: the recipe, the digest, every installed package's version, size and build time), one builder per
image at a time across processes (a lock file), and removing what a failed or killed build left.
Why mmdebstrap: it builds a root file system from a package list with apt's own resolver in one call, from any
archive apt reaches, as root without a chroot set-up of our own (debootstrap needs a second apt pass for the
package list, and knows no ``--include`` with apt's dependency resolution).
Must never: hand out an image whose manifest is missing or names another digest (a half-built or stale one).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from ..errors import EnvsError
from .recipes import ImageRecipe

DEFAULT_STORE = Path(os.environ.get("BUNSHIN_IMAGE_DIR", "/var/lib/bunshin/images"))
BUILD_TIMEOUT_S = 1800.0
_PARTIAL = ".partial-"


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    """What a built image is: its recipe and digest, and what the archive gave for it that day."""

    recipe: ImageRecipe
    digest: str
    packages: dict[str, str]  # every installed package -> its version (dpkg's status file)
    size_bytes: int
    built_at: str  # UTC, ISO 8601
    build_seconds: float
    builder: str  # the mmdebstrap that built it


@dataclass(frozen=True)
class BuiltImage:
    """A built image in the store: ``root`` is its root file system."""

    path: Path
    manifest: Manifest

    @property
    def root(self) -> Path:
        return self.path / "root"

    @property
    def name(self) -> str:
        return self.manifest.recipe.name


class ImageNotBuilt(EnvsError):
    """A workspace needs a declared image the store does not hold yet."""

    def __init__(self, recipe: ImageRecipe, store: Path):
        super().__init__(f"workspace image {recipe.name!r} ({recipe.key()}) is not built in {store}: run "
                         f"`bunshin images build {recipe.name}` (scripts/setup.sh builds the suites' images)")
        self.recipe = recipe


class ImageBuildFailed(EnvsError):
    """Building a declared image failed; the message names the image and ends with the builder's last lines."""


Progress = Callable[[str], None]


class ImageStore:
    """The declared images built on this machine, in ``root`` (``BUNSHIN_IMAGE_DIR``, else /var/lib/bunshin/images)."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root or DEFAULT_STORE)

    def find(self, recipe: ImageRecipe) -> BuiltImage | None:
        """The built image of ``recipe``, or None (never one whose manifest is absent, unreadable or of another
        digest)."""
        path = self.root / recipe.key()
        try:
            manifest = msgspec.json.decode((path / "manifest.json").read_bytes(), type=Manifest)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            return None
        if manifest.digest != recipe.digest() or not (path / "root" / "usr").is_dir():
            return None
        return BuiltImage(path, manifest)

    def require(self, recipe: ImageRecipe) -> BuiltImage:
        """The built image of ``recipe`` (``ImageNotBuilt`` naming the command that builds it)."""
        built = self.find(recipe)
        if built is None:
            raise ImageNotBuilt(recipe, self.root)
        return built

    def built(self) -> list[BuiltImage]:
        """Every complete image in the store, by directory name."""
        found = []
        for path in sorted(self.root.glob("*/manifest.json")) if self.root.is_dir() else []:
            try:
                manifest = msgspec.json.decode(path.read_bytes(), type=Manifest)
            except (OSError, msgspec.DecodeError, msgspec.ValidationError):
                continue
            found.append(BuiltImage(path.parent, manifest))
        return found

    def build(self, recipe: ImageRecipe, progress: Progress = lambda line: None, *,
              timeout_s: float = BUILD_TIMEOUT_S) -> BuiltImage:
        """Build ``recipe`` unless it is built; return it. One builder per image across processes: a second one
        waits for the first and takes its result. On any failure (the deadline, an interrupt too) nothing of the
        attempt is left."""
        self.root.mkdir(parents=True, exist_ok=True)
        with self._lock(recipe):
            built = self.find(recipe)
            if built is not None:
                return built
            for stale in self.root.glob(f"{recipe.key()}{_PARTIAL}*"):  # a build killed before it could clean up
                shutil.rmtree(stale, ignore_errors=True)
            partial = self.root / f"{recipe.key()}{_PARTIAL}{os.getpid()}"
            try:
                partial.mkdir()
                started = time.monotonic()
                builder = _run_mmdebstrap(recipe, partial / "root", progress, timeout_s)
                _install_pip(recipe, partial / "root", progress, timeout_s)
                progress(f"image {recipe.name}: reading what was installed")
                manifest = Manifest(recipe=recipe, digest=recipe.digest(), packages=installed_packages(partial / "root"),
                                    size_bytes=tree_size(partial / "root"),
                                    built_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                    build_seconds=round(time.monotonic() - started, 1), builder=builder)
                (partial / "manifest.json").write_bytes(msgspec.json.format(msgspec.json.encode(manifest)))
                final = self.root / recipe.key()
                if final.exists():  # a stale directory without a valid manifest
                    shutil.rmtree(final)
                partial.rename(final)
            except BaseException:
                shutil.rmtree(partial, ignore_errors=True)
                raise
        progress(f"image {recipe.name}: built ({len(manifest.packages)} packages, "
                 f"{manifest.size_bytes / 2**20:.0f} MiB, {manifest.build_seconds:.0f} s) in {final}")
        return BuiltImage(final, manifest)

    def prune(self, keep: set[str]) -> list[str]:
        """Remove every image whose key is not in ``keep`` (an older recipe's, say) and what killed builds left;
        the names removed. An image being built now is left alone (its builder holds its lock)."""
        removed = []
        for path in sorted(self.root.iterdir()) if self.root.is_dir() else []:
            if not path.is_dir() or path.name in keep:
                continue
            key = path.name.split(_PARTIAL, 1)[0]
            lock = os.open(self.root / f".{key}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                shutil.rmtree(path)
                removed.append(path.name)
            finally:
                os.close(lock)
        return removed

    @contextlib.contextmanager
    def _lock(self, recipe: ImageRecipe) -> Iterator[None]:
        fd = os.open(self.root / f".{recipe.key()}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def _run_mmdebstrap(recipe: ImageRecipe, target: Path, progress: Progress, timeout_s: float) -> str:
    """Run mmdebstrap for ``recipe`` into ``target`` (which must not exist); its version. Progress: its stage lines,
    and a count of the packages fetched every hundred."""
    if shutil.which("mmdebstrap") is None:
        raise ImageBuildFailed(f"image {recipe.name}: mmdebstrap not found (apt-get install mmdebstrap; "
                               "scripts/setup.sh installs it)")
    version = subprocess.run(["mmdebstrap", "--version"], capture_output=True, text=True).stdout.strip()
    command = [
        # a private mount namespace: the /proc, /sys and /dev mmdebstrap mounts in the target die with it
        "unshare", "--mount", "--propagation", "private",
        "mmdebstrap", "--variant=minbase", "--mode=root", "--format=directory",
        "--aptopt=APT::Install-Recommends \"false\"",
        "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-include=/usr/share/doc/*/copyright",
        "--dpkgopt=path-exclude=/usr/share/man/*",
        f"--include={','.join(recipe.packages)}", recipe.release, str(target), "-",
    ]
    progress(f"image {recipe.name}: building {recipe.key()} with {version} "
             f"(Debian {recipe.release} minbase + {len(recipe.packages)} packages)")
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    assert proc.stdin is not None and proc.stdout is not None
    tail: list[str] = []
    fetched = 0
    overran = threading.Event()

    def stop_at_deadline() -> None:
        overran.set()
        stop_group(proc)

    timer = threading.Timer(timeout_s, stop_at_deadline)  # the deadline, even while the builder is silent
    timer.daemon = True
    with _killed_on_exit(proc):
        timer.start()
        try:
            proc.stdin.write("\n".join(recipe.sources) + "\n")
            proc.stdin.close()
            for line in proc.stdout:
                line = line.rstrip()
                tail = (tail + [line])[-30:]
                if line.startswith("Get:"):
                    fetched += 1
                    if fetched % 100 == 0:
                        progress(f"image {recipe.name}: {fetched} files fetched")
                elif line.startswith(("I: ", "E: ", "W: ")):
                    progress(f"image {recipe.name}: {line[3:]}")
            code = proc.wait()
        finally:
            timer.cancel()
    if overran.is_set():
        raise ImageBuildFailed(f"image {recipe.name}: not built within {timeout_s:.0f} s; last lines:\n"
                               + "\n".join(tail))
    if code != 0:
        raise ImageBuildFailed(f"image {recipe.name}: mmdebstrap exited with {code}; last lines:\n" + "\n".join(tail))
    return version


def _install_pip(recipe: ImageRecipe, root: Path, progress: Progress, timeout_s: float) -> None:
    """The recipe's pinned Python packages, without dependencies, into the image's /usr/local for its python3
    (installed by this interpreter's pip, then compiled by the image's own python3, so that a read-only /usr
    imports them without writing)."""
    if not recipe.pip:
        return
    pythons = sorted(p.name for p in root.glob("usr/lib/python3.*") if p.name[len("python3."):].isdigit())
    if not pythons:
        raise ImageBuildFailed(f"image {recipe.name}: pip packages need python3 in the image's package list")
    site = f"/usr/local/lib/{pythons[-1]}/dist-packages"
    progress(f"image {recipe.name}: pip installing {' '.join(recipe.pip)} into {site}")
    for command in ([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "--disable-pip-version-check",
                     "--no-warn-script-location", "--target", str(root) + site, *recipe.pip],
                    ["chroot", str(root), "python3", "-m", "compileall", "-q", site]):
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise ImageBuildFailed(f"image {recipe.name}: {command[2]} not done within {timeout_s:.0f} s") from exc
        if done.returncode != 0:
            raise ImageBuildFailed(f"image {recipe.name}: {' '.join(command[:5])} ... exited with {done.returncode}:\n"
                                   + (done.stdout + done.stderr)[-3000:])


def stop_group(proc: subprocess.Popen[Any], timeout_s: float = 20.0) -> None:
    """Ask a process group led by ``proc`` to stop (SIGTERM: mmdebstrap and dockerd clean up on it); kill it if it
    has not within ``timeout_s``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextlib.contextmanager
def _killed_on_exit(proc: subprocess.Popen[str]) -> Iterator[None]:
    """Whatever happens (an interrupt, an error reading its output), the builder's process group is gone on exit."""
    try:
        yield
    finally:
        if proc.poll() is None:
            stop_group(proc)


def installed_packages(root: Path) -> dict[str, str]:
    """Package -> version of everything dpkg says is installed in ``root`` (its status file, read directly: the
    host's dpkg is not needed)."""
    packages: dict[str, str] = {}
    text = (root / "var/lib/dpkg/status").read_text(errors="replace")
    for stanza in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line[0].isspace())
        if fields.get("Status", "").endswith(" installed") and "Package" in fields:
            packages[fields["Package"]] = fields.get("Version", "")
    return dict(sorted(packages.items()))


def tree_size(root: Path) -> int:
    """Bytes of the files under ``root`` (apparent sizes, links not followed)."""
    total = 0
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total

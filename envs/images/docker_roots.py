"""Local Docker images as workspace roots, and the declared images as Docker images.

Owns: naming a Docker image (``docker:NAME[:TAG]``, ``DockerRef``); the cache of flattened roots,
``<dir>/<image id>/`` (``root/`` and ``config.json``: the image's ``Env``, ``WorkingDir``, ``User``,
``Entrypoint`` and ``Cmd``), filled from a created (never started) container's export and kept by the image's
id, one extractor per id at a time across processes (a lock file), with progress; removing what a failed or killed
extraction left (its partial directory, its container); and ``import_root``: a root file system (a declared image's)
made a Docker image with ``docker import``'s endpoint, so tests and users have one without a registry.
Why a container's export, not the image's ``save``: the daemon applies the layers and their whiteouts itself; a
saved image would need our own overlay arithmetic. Why aiodocker's ``_query`` for export and import: its public
API wraps neither endpoint (``containers/{id}/export``, ``images/create?fromSrc=-``).
Must never: hand out a root whose extraction did not finish, or leave a container of its own behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec

from ..errors import EnvsError

DOCKER_PREFIX = "docker:"
DEFAULT_CACHE = Path(os.environ.get("BUNSHIN_DOCKER_ROOTS", "/var/lib/bunshin/docker-roots"))
DEFAULT_SOCKET = os.environ.get("BUNSHIN_DOCKER_HOST", "unix:///var/run/docker.sock")
EXPORT_LABEL = "bunshin.export"  # on the created containers an extraction exports (the value: the extractor's pid)
_PARTIAL = ".partial-"
_CHUNK = 1 << 20
_PROGRESS_EVERY = 64 << 20

Progress = Callable[[str], None]


class DockerError(EnvsError):
    """The root of this module's errors; each names the image or the daemon it is about."""


class DockerUnavailable(DockerError):
    """No Docker daemon answers at the address the runtime was given."""

    def __init__(self, address: str, cause: object):
        super().__init__(f"no Docker daemon answers at {address} ({cause}): start dockerd (Debian: apt-get install "
                         f"docker.io; the test command starts one itself) or set BUNSHIN_DOCKER_HOST")
        self.address = address


class DockerImageMissing(DockerError):
    """The daemon has no image of that name (no registry is asked: images are loaded or imported locally)."""

    def __init__(self, ref: DockerRef):
        super().__init__(f"Docker image {ref.name!r} is not on this daemon: load it (`docker load -i FILE`), "
                         f"import a root file system (`docker import`), or build it; nothing is pulled")
        self.ref = ref


class DockerImportFailed(DockerError):
    """Taking an image's file system into the cache, or a root into Docker, failed (a full disk, the daemon
    going away); the message names the image, where it was going and the cause. Nothing of the attempt is left."""


class DockerRef(msgspec.Struct, frozen=True):
    """A local Docker image by name (``NAME[:TAG]``, a tag defaulting to ``latest`` as Docker's own) or id."""

    name: str

    @classmethod
    def parse(cls, text: str) -> DockerRef:
        """``docker:NAME[:TAG]`` (``ValueError`` naming the text when it is not one)."""
        if not text.startswith(DOCKER_PREFIX) or not text[len(DOCKER_PREFIX):].strip():
            raise ValueError(f"not a Docker image reference: {text!r} (expected docker:NAME[:TAG])")
        name = text[len(DOCKER_PREFIX):].strip()
        if any(c.isspace() for c in name):
            raise ValueError(f"not a Docker image reference: {text!r} (a name has no spaces)")
        return cls(name)

    def __str__(self) -> str:
        return f"{DOCKER_PREFIX}{self.name}"


def is_docker_ref(text: object) -> bool:
    return isinstance(text, str) and text.startswith(DOCKER_PREFIX)


class ImageConfig(msgspec.Struct, frozen=True, kw_only=True):
    """What the image says of how its programs run (Docker's ``Config``); empty where it says nothing."""

    env: dict[str, str] = {}
    working_dir: str = ""
    user: str = ""
    entrypoint: list[str] = []
    cmd: list[str] = []

    @classmethod
    def from_inspect(cls, config: dict[str, Any] | None) -> ImageConfig:
        config = config or {}
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in config.get("Env") or [])
        return cls(env=env, working_dir=config.get("WorkingDir") or "", user=config.get("User") or "",
                   entrypoint=list(config.get("Entrypoint") or []), cmd=list(config.get("Cmd") or []))


class DockerRoot(msgspec.Struct, frozen=True, kw_only=True):
    """A cached root: ``path`` holds ``root/`` and ``config.json``."""

    ref: str
    image_id: str
    config: ImageConfig
    size_bytes: int
    extract_seconds: float
    path: str = ""

    @property
    def root(self) -> Path:
        return Path(self.path) / "root"


@contextlib.asynccontextmanager
async def docker_client(address: str | None = None) -> AsyncIterator[Any]:
    """An aiodocker client on ``address`` (``BUNSHIN_DOCKER_HOST``, else the local socket), closed on exit."""
    import aiodocker

    client = aiodocker.Docker(url=address or DEFAULT_SOCKET)
    try:
        yield client
    finally:
        await client.close()


def translate(exc: Exception, ref: DockerRef | None, address: str) -> Exception:
    """aiodocker's error as ours: a daemon that does not answer, an image it lacks, or the daemon's own message."""
    import aiodocker

    if isinstance(exc, aiodocker.DockerError):
        if exc.status == 900:
            return DockerUnavailable(address, exc.message)
        if exc.status == 404 and ref is not None and "image" in str(exc.message).lower():
            return DockerImageMissing(ref)
        return DockerError(f"Docker daemon at {address}: {exc.status} {exc.message}")
    return exc


class DockerRoots:
    """The flattened roots of Docker images on this machine, in ``cache`` (``BUNSHIN_DOCKER_ROOTS``, else
    /var/lib/bunshin/docker-roots), read from the daemon at ``address``."""

    def __init__(self, cache: Path | None = None, address: str | None = None):
        self.cache = Path(cache or DEFAULT_CACHE)
        self.address = address or DEFAULT_SOCKET

    async def get(self, ref: DockerRef, progress: Progress = lambda line: None) -> DockerRoot:
        """The root of ``ref``'s image as the daemon has it now (its id is asked every time: a re-tagged name gets
        the new image's root), extracted once per image id. ``DockerUnavailable``, ``DockerImageMissing``,
        ``DockerImportFailed``."""
        async with docker_client(self.address) as client:
            try:
                info = await client.images.inspect(ref.name)
            except Exception as exc:
                raise translate(exc, ref, self.address) from exc
            image_id = str(info["Id"]).removeprefix("sha256:")
            config = ImageConfig.from_inspect(info.get("Config"))
            found = self.find(image_id)
            if found is not None:
                return found
            self.cache.mkdir(parents=True, exist_ok=True)
            lock = await _take_lock(self.cache / f".{image_id}.lock")
            try:
                found = self.find(image_id)  # another process extracted it while we waited
                if found is not None:
                    return found
                await self._remove_stale(client, image_id)
                return await self._extract(client, ref, image_id, config, progress)
            finally:
                os.close(lock)

    def find(self, image_id: str) -> DockerRoot | None:
        """The cached root of the image ``image_id``, or None (never one without its config, a finished mark)."""
        path = self.cache / image_id
        try:
            found = msgspec.json.decode((path / "config.json").read_bytes(), type=DockerRoot)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            return None
        if found.image_id != image_id or not (path / "root").is_dir():
            return None
        return msgspec.structs.replace(found, path=str(path))

    def cached(self) -> list[DockerRoot]:
        """Every complete root in the cache."""
        found = (self.find(p.name) for p in sorted(self.cache.iterdir()) if p.is_dir()) if self.cache.is_dir() else ()
        return [f for f in found if f is not None]

    async def _remove_stale(self, client: Any, image_id: str) -> None:
        """What an extraction killed before its clean-up left: its partial directories and its containers."""
        for stale in self.cache.glob(f"{image_id}{_PARTIAL}*"):
            await asyncio.to_thread(shutil.rmtree, stale, True)
        for container in await client.containers.list(all=True, filters={"label": [EXPORT_LABEL]}):
            labels = (container["Labels"] or {}) if "Labels" in container else {}
            pid = int(labels.get(EXPORT_LABEL, "0") or 0)
            if pid and not _alive(pid):
                with contextlib.suppress(Exception):
                    await container.delete(force=True)

    async def _extract(self, client: Any, ref: DockerRef, image_id: str, config: ImageConfig,
                       progress: Progress) -> DockerRoot:
        partial = self.cache / f"{image_id}{_PARTIAL}{os.getpid()}"
        started = time.monotonic()
        container = None
        try:
            partial.mkdir()
            (partial / "root").mkdir(mode=0o755)
            try:  # created, never started: its file system is the image's, with the daemon's few mount points
                container = await client.containers.create(
                    {"Image": image_id, "Entrypoint": ["/"], "Cmd": [], "NetworkDisabled": True,
                     "Labels": {EXPORT_LABEL: str(os.getpid())}})
            except Exception as exc:
                raise translate(exc, ref, self.address) from exc
            size = await self._untar(client, container.id, partial / "root", ref, progress)
            found = DockerRoot(ref=ref.name, image_id=image_id, config=config, size_bytes=size,
                               extract_seconds=round(time.monotonic() - started, 2))
            (partial / "config.json").write_bytes(msgspec.json.encode(found))
            final = self.cache / image_id
            if final.exists():  # a stale directory without a finished config
                await asyncio.to_thread(shutil.rmtree, final)
            partial.rename(final)
        except BaseException:
            await asyncio.shield(asyncio.to_thread(shutil.rmtree, partial, True))
            raise
        finally:
            if container is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(container.delete(force=True))
        progress(f"{ref}: {size / 2**20:.0f} MiB extracted in {found.extract_seconds:.1f} s into {final}")
        return msgspec.structs.replace(found, path=str(final))

    async def _untar(self, client: Any, container_id: str, dest: Path, ref: DockerRef, progress: Progress) -> int:
        """Stream the container's export into ``tar -x`` (numeric owners, modes, devices kept); the bytes read.
        tar's messages go to a file (one per file once the disk is full: in a pipe nobody reads meanwhile they
        would fill it and stop tar reading its input)."""
        with tempfile.TemporaryFile() as messages:
            tar = await asyncio.create_subprocess_exec(
                "tar", "--numeric-owner", "-xpf", "-", "-C", str(dest), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL, stderr=messages)
            assert tar.stdin is not None
            total, told = 0, 0
            try:
                try:
                    async with client._query(f"containers/{container_id}/export", "GET", timeout=None) as response:
                        async for chunk in response.content.iter_chunked(_CHUNK):
                            tar.stdin.write(chunk)
                            await tar.stdin.drain()
                            total += len(chunk)
                            if total - told >= _PROGRESS_EVERY:
                                told = total
                                progress(f"{ref}: {total / 2**20:.0f} MiB extracted")
                    tar.stdin.close()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # tar stopped reading: its status and message say why
                except Exception as exc:
                    raise DockerImportFailed(f"{ref}: reading the image's files from the daemon failed: "
                                             f"{translate(exc, ref, self.address)}") from exc
                if await tar.wait() != 0:
                    messages.seek(0)
                    lines = first_lines(messages.read(1 << 20).decode(errors="replace"))
                    raise DockerImportFailed(f"{ref}: extracting its files into {dest.parent} failed: "
                                             f"{lines[0] if lines else f'tar exit {tar.returncode}'}")
            finally:
                if tar.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        tar.kill()
                    await asyncio.shield(tar.wait())
        return total


def first_lines(text: str, keep: int = 5) -> list[str]:
    """The first ``keep`` lines of a child's messages, a full disk's first (wherever it came) ahead of them."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    full = next((line for line in lines if "No space left on device" in line), "")
    return [full, *lines[:keep]] if full else lines[:keep]


async def import_root(root: Path, name: str, tag: str, *, address: str | None = None, changes: tuple[str, ...] = (),
                      progress: Progress = lambda line: None) -> str:
    """``root`` (a root file system) as the Docker image ``name:tag`` unless the daemon has it already; its id.
    The files stream from ``tar -c`` to the daemon (``docker import``'s endpoint) with progress; ``changes``:
    Dockerfile instructions for its configuration (``ENV A=b``, ``WORKDIR /srv``...), as ``docker import -c``."""
    ref = DockerRef(f"{name}:{tag}")
    address = address or DEFAULT_SOCKET
    async with docker_client(address) as client:
        try:
            return str((await client.images.inspect(ref.name))["Id"])
        except Exception as exc:
            mine = translate(exc, ref, address)
            if not isinstance(mine, DockerImageMissing):
                raise mine from exc
        tar = await asyncio.create_subprocess_exec(
            "tar", "--numeric-owner", "-cf", "-", "-C", str(root), ".", stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        assert tar.stdout is not None and tar.stderr is not None
        sent = [0, 0]

        async def body() -> AsyncIterator[bytes]:
            assert tar.stdout is not None
            while chunk := await tar.stdout.read(_CHUNK):
                sent[0] += len(chunk)
                if sent[0] - sent[1] >= _PROGRESS_EVERY:
                    sent[1] = sent[0]
                    progress(f"{ref}: {sent[0] / 2**20:.0f} MiB sent to the daemon")
                yield chunk

        try:
            async with client._query_chunked_post(
                    "images/create", params={"fromSrc": "-", "repo": name, "tag": tag,
                                             **({"changes": "\n".join(changes)} if changes else {})}, data=body(),
                    headers={"Content-Type": "application/x-tar"}, timeout=None) as response:
                answer = (await response.read()).decode(errors="replace")
            err = (await tar.stderr.read()).decode(errors="replace").strip()
            if await tar.wait() != 0:
                raise DockerImportFailed(f"{ref}: reading {root} failed: {err or tar.returncode}")
            if '"error"' in answer:
                raise DockerImportFailed(f"{ref}: the daemon refused the import: {answer.strip()[-500:]}")
            image_id = str((await client.images.inspect(ref.name))["Id"])
        except DockerError:
            raise
        except Exception as exc:
            raise DockerImportFailed(f"{ref}: import from {root} failed: {translate(exc, ref, address)}") from exc
        finally:
            if tar.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    tar.kill()
                await asyncio.shield(tar.wait())
        progress(f"{ref}: imported ({sent[0] / 2**20:.0f} MiB), id {image_id[:19]}")
        return image_id


async def _take_lock(path: Path) -> int:
    """The extraction lock of one image id, polled (a waiter cancelled meanwhile holds nothing)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                await asyncio.sleep(0.2)
    except BaseException:
        os.close(fd)
        raise


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

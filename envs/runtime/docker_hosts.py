"""Hosts in Docker containers (``WorkspaceRuntime(runtime="docker")``, ``--runtime docker``): each workspace a
container made through aiodocker, our host started in it as its pid 1 and connected back to the engine.

Owns: the container's configuration, which is the workspace's isolation there: no network (``NetworkMode`` none),
every capability dropped but the six the host needs to run agent commands as the agent's uid and hand it files
(SETUID, SETGID, KILL, CHOWN, FOWNER, DAC_OVERRIDE; the agents have none), no new privileges, Docker's default
seccomp profile, the run's memory and pids limits, the image read-only under the container's own writable layer,
the run's cgroup as its parent (the run's charge covers every container), the labels ``bunshin=<run id>``; the
runtime's interpreter and sources bound read-only below a root-only directory, reached by symlinks (as
``rootfs.py`` does); the pool's dumps and a per-workspace socket directory bound where only root reaches them.
Starting one (the socket listened on before, its host's connection accepted within the start timeout), stopping
it, removing it on every path, and removing what a dead run left (its containers and committed images, at the
next start: ``remove_stale``). Which Docker image a workspace starts from is ``docker_images.py``'s; forks are
``fork/docker.py``'s (a fresh container from the source's committed files plus its app state restored).
Must never: leave a container, a committed image, a socket or a cgroup behind when a start fails or is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import shutil
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ImageFailed, StartTimeout, WorkspaceStartFailed
from ..images.docker_roots import DockerError, docker_client, translate
from ..records import AppSpec
from ..seeds import derive_seed
from . import await_points
from .cgroups import Cgroup, remove_in_every_hierarchy
from .channel import async_send_frame
from .docker_images import DockerImages
from .egress import parse_allow
from .fork.backends import ForkBackend
from .host_workspace import HostSnapshot, HostWorkspace
from .hosts import Hosts, RunResources
from .image_files import WorkspaceImage
from .layers import DUMPS
from .protocol import HostConfig, encoder
from .rootfs import RUNTIME_DIR

log = logging.getLogger(__name__)

LABEL = "bunshin"  # its value: the run id
POOL_DIR = "/.bunshin-pool"  # in a container: the dumps (``dumps/``) and the engine's socket (``io/host.sock``)
HOST_CAPS = ("SETUID", "SETGID", "KILL", "CHOWN", "FOWNER", "DAC_OVERRIDE")
STOP_TIMEOUT_S = 30.0


def entry_script(runtime_binds: list[str]) -> str:
    """The container's first program (``/bin/sh -c``): the runtime's paths linked to where they are bound, the
    bound directories closed to all but root, then our host exec'd as pid 1."""
    lines = ["set -e"]
    for path in runtime_binds:
        lines.append(f"if [ ! -e {shlex.quote(path)} ] && [ ! -L {shlex.quote(path)} ]; then "
                     f"mkdir -p {shlex.quote(os.path.dirname(path))}; "
                     f"ln -s {shlex.quote(RUNTIME_DIR + path)} {shlex.quote(path)}; fi")
    lines.append(f"chmod 700 {RUNTIME_DIR} {POOL_DIR}")
    lines.append(f"exec {shlex.quote(sys.executable)} -m bunshin.envs.runtime.host --container {POOL_DIR}")
    return "\n".join(lines)


def exit_status(code: int) -> int:
    """Docker's exit code of a container's pid 1 as a wait status (128+N: killed by signal N)."""
    return code - 128 if code > 128 else code << 8


class ContainerWorkspace(HostWorkspace):
    """A host workspace whose host is pid 1 of a Docker container (``container_id``)."""

    container_id: str = ""
    image_ref: str = ""  # the Docker image it started from

    async def _death_reason(self) -> str:
        """Why the host went away, the daemon's word on an OOM kill beside it: the container's cgroup, where the
        counter was, is gone with the container."""
        reason = await super()._death_reason()
        services = self.services
        if isinstance(services, DockerHosts) and "memory limit" not in reason and await services.oom_killed(self):
            return f"{reason}; memory limit: the OOM killer ran in the workspace"
        return reason


class ContainerSnapshot(HostSnapshot, ContainerWorkspace):
    """A frozen container workspace: its host restored, answering only forks."""


class DockerHosts(Hosts):
    """The hosts of a Docker run: ``Hosts`` with containers in place of the nursery's processes and layers."""

    def __init__(self, run: RunResources, make_backend: Callable[[Hosts], ForkBackend], images: DockerImages,
                 run_id: str, address: str):
        super().__init__(run, make_backend)
        self.docker_images = images
        self.run_id = run_id
        self.address = address
        self.client: Any = None
        self.containers: dict[int, str] = {}  # a host's pid -> its container, until the container is removed

    async def open(self) -> None:
        """The daemon's client for the run (``DockerUnavailable`` when none answers)."""
        from ..images.docker_roots import DEFAULT_SOCKET

        self._client_cm = docker_client(self.address or DEFAULT_SOCKET)
        self.client = await self._client_cm.__aenter__()
        try:
            await self.client.version()
        except Exception as exc:
            await self._client_cm.__aexit__(None, None, None)
            self.client = None
            raise translate(exc, None, self.address) from exc

    async def aclose(self) -> None:
        try:
            await super().aclose()
            # the containers' parent, which Docker made in every hierarchy (ours too): empty now
            await asyncio.to_thread(remove_in_every_hierarchy, self.run.cgroup.rel)
        finally:
            if self.client is not None:
                with contextlib.suppress(Exception):
                    await self.remove_run_images()
                await self._client_cm.__aexit__(None, None, None)
                self.client = None

    def prepare(self, app: AppSpec) -> None:
        """Nothing to prepare: a container's clone takes no warm slot or shell."""

    async def image(self, source: HostWorkspace, name: str) -> WorkspaceImage:
        raise ImageFailed(source.id, "durable images of a workspace are not supported under --runtime docker yet")

    # -- starting ------------------------------------------------------------------------------------------------
    async def start(self, ws_id: str, layer: str, app: AppSpec, *, seed: int | None, hostname: str | None,
                    restore_from: str | None = None, restore_workers: int = 0, parent: str | None = None,
                    generation: int = 0, frozen: bool = False, register: bool = True) -> HostWorkspace:
        """A container for ``ws_id``, its host ready. ``layer``: the committed image a clone starts from ('': the
        app's image, ``docker_images.py``). On any failure (cancellation too) the container, its socket directory
        and its cgroup are removed."""
        parse_allow(app.egress)
        if app.egress:
            raise WorkspaceStartFailed(ws_id, "an egress allow-list is not supported under --runtime docker yet")
        image_ref = layer or await self.docker_images.for_app(app)
        if app.merge_memory and self.run.ksm is not None and not self.run.ksm.held:
            await asyncio.to_thread(self.run.ksm.take)  # ksmd tuned before the first mergeable program starts
        seed = derive_seed(self.run.seed, ws_id) if seed is None else seed
        io_dir = self.run.run_dir / "io" / ws_id
        config = HostConfig(
            ws_id=ws_id, hostname=hostname or f"ws-{ws_id}", seed=seed, layer="", lower="", image_binds=[],
            runtime_binds=self.run.runtime_binds, mount_target="", cgroup_rel="", app=app, reaper_pid=0,
            restore_from=restore_from, restore_workers=restore_workers, faults=self.run.faults,
            merge_memory=app.merge_memory, container=True,
            image_env=self.docker_images.config_env(image_ref), image_cwd=self.docker_images.config_cwd(image_ref))
        container_id = ""
        listener = engine_end = None
        try:
            await await_points.reached("hosts.start.spawn")
            listener = await asyncio.to_thread(_listen, io_dir)
            container_id = await self._create(ws_id, config, image_ref, io_dir)
            await self._container(container_id).start()
            engine_end = await self._accept(ws_id, listener, container_id)
            await async_send_frame(engine_end, encoder.encode(config))
            await self.await_ready(ws_id, engine_end)
            pid = int((await self._container(container_id).show())["State"]["Pid"])
            self.containers[pid] = container_id
            cls = ContainerSnapshot if frozen else ContainerWorkspace
            ws = cls(self, ws_id, pid=pid, sock=engine_end, cgroup=self.run.cgroup.child(container_id), layer="",
                     seed=seed, app=app, parent=parent, generation=generation)
            ws.container_id, ws.image_ref = container_id, image_ref
        except BaseException as exc:
            if engine_end is not None:
                engine_end.close()
            await asyncio.shield(self._remove(container_id, ws_id))
            if isinstance(exc, DockerError):
                raise WorkspaceStartFailed(ws_id, str(exc)) from exc
            if isinstance(exc, Exception) and not isinstance(exc, WorkspaceStartFailed):
                raise WorkspaceStartFailed(ws_id, f"{type(exc).__name__}: {translate(exc, None, self.address)}"
                                                  f"{self.host_log(ws_id)}") from exc
            raise
        finally:
            if listener is not None:
                listener.close()
        if register:
            self.register(ws)
        return ws

    def _container(self, container_id: str) -> Any:
        return self.client.containers.container(container_id)

    async def _create(self, ws_id: str, config: HostConfig, image_ref: str, io_dir: Path) -> str:
        binds = [f"{path}:{RUNTIME_DIR}{path}:ro" for path in config.runtime_binds]
        binds += [f"{self.layers.path(DUMPS)}:{POOL_DIR}/{DUMPS}:rw", f"{io_dir}:{POOL_DIR}/io:rw"]
        limits = self.limits
        host_config: dict[str, Any] = {
            "NetworkMode": "none", "CapDrop": ["ALL"], "CapAdd": list(HOST_CAPS),
            "SecurityOpt": ["no-new-privileges"], "Binds": binds, "CgroupParent": f"/{self.run.cgroup.rel}",
            "Memory": limits.memory_bytes, "MemorySwap": limits.memory_bytes, "PidsLimit": limits.pids,
            "ShmSize": 64 << 20, "IpcMode": "private", "Init": False,
        }
        body = {"Image": image_ref, "Entrypoint": ["/bin/sh", "-c", entry_script(config.runtime_binds)], "Cmd": [],
                "Hostname": config.hostname, "User": "0:0", "WorkingDir": "/", "NetworkDisabled": True,
                "Env": ["PYTHONDONTWRITEBYTECODE=1", "PATH=/usr/local/bin:/usr/bin:/bin",
                        *([f"PYTHONPATH={os.environ['PYTHONPATH']}"] if os.environ.get("PYTHONPATH") else [])],
                "Labels": {LABEL: self.run_id, "bunshin.workspace": ws_id}, "HostConfig": host_config}
        try:
            container = await self.client.containers.create(body, name=f"bunshin-{self.run_id}-{ws_id}")
        except Exception as exc:
            raise translate(exc, None, self.address) from exc
        return str(container.id)

    async def _accept(self, ws_id: str, listener: socket.socket, container_id: str) -> socket.socket:
        """The host's connection, within the start timeout (a container that exits first fails the start with its
        output; asked every half second while none has come)."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.run.start_timeout_s):
                while True:
                    try:
                        async with asyncio.timeout(0.5):
                            sock, _ = await loop.sock_accept(listener)
                        sock.setblocking(False)
                        return sock
                    except TimeoutError:
                        state = (await self._container(container_id).show())["State"]
                        if not state.get("Running"):
                            raise WorkspaceStartFailed(
                                ws_id, f"its container exited ({state.get('ExitCode')}) before its host connected"
                                       f"{await self._output(container_id)}") from None
        except TimeoutError as exc:
            raise StartTimeout(ws_id, f"its container's host did not connect within "
                                      f"{self.run.start_timeout_s:g}s") from exc

    async def _output(self, container_id: str) -> str:
        with contextlib.suppress(Exception):
            lines = await self._container(container_id).log(stdout=True, stderr=True, tail=40)
            text = "".join(lines).strip()
            return f"\n--- container output ---\n{text[-4000:]}" if text else ""
        return ""

    def host_log(self, ws_id: str) -> str:
        return ""  # a container's output is read from the daemon (``_output``), not a file of the run

    # -- stopping and removing -----------------------------------------------------------------------------------
    async def wait_exit(self, pid: int, timeout: float) -> int | None:
        container_id = self.containers.get(pid, "")
        if not container_id:
            return None
        try:
            async with asyncio.timeout(timeout):
                answer = await self._container(container_id).wait()
        except TimeoutError:
            return None
        except Exception:
            return None
        return exit_status(int(answer.get("StatusCode", 0)))

    async def oom_killed(self, ws: HostWorkspace) -> bool:
        """Whether the daemon says the OOM killer ran in ``ws``'s container."""
        container_id = self.containers.get(ws.pid, "")
        try:
            return bool(container_id) and bool((await self._container(container_id).show())["State"]["OOMKilled"])
        except Exception:
            return False

    def stop(self, ws: HostWorkspace) -> None:
        """SIGKILL the container's pid 1 (the daemon sees it exit and ends every process of the container)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(ws.pid, 9)

    async def _discard(self, ws: HostWorkspace) -> None:
        try:
            await self._remove(self.containers.get(ws.pid, ""), ws.id)
        finally:
            self.containers.pop(ws.pid, None)
        await self.backend.forget(ws)

    async def _remove(self, container_id: str, ws_id: str) -> None:
        """Remove the container (killing what runs in it), its socket directory and its cgroup. Finishes under
        cancellation; a container already gone is no error."""
        if container_id and self.client is not None:
            try:
                await self._container(container_id).delete(force=True)
            except Exception as exc:
                if getattr(exc, "status", None) != 404:
                    log.warning("container %s of %s: removal failed: %r", container_id[:12], ws_id, exc)
                    raise
        await asyncio.to_thread(shutil.rmtree, self.run.run_dir / "io" / ws_id, True)
        if container_id:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(Cgroup.remove, self.run.cgroup.child(container_id))

    async def remove_run_images(self) -> None:
        """The images this run committed (its forks' dumps) that are left: removed at the run's close."""
        for image in await self.client.images.list(filters={"label": [f"{LABEL}={self.run_id}"]}):
            with contextlib.suppress(Exception):
                await self.client.images.delete(image["Id"], force=True)


def _listen(io_dir: Path) -> socket.socket:
    """The engine's end: a Unix socket in ``io_dir`` (root's only), the one connection a host makes to it."""
    io_dir.mkdir(parents=True, mode=0o700)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        listener.bind(str(io_dir / "host.sock"))
        listener.listen(1)
        listener.setblocking(False)
    except BaseException:
        listener.close()
        raise
    return listener


async def remove_stale(address: str, live_runs: set[str]) -> list[str]:
    """Containers and committed images labelled with a run that is not live (its engine was killed): removed.
    What was removed, by kind and id; a daemon that does not answer removes nothing (its leftovers wait)."""
    removed: list[str] = []
    async with docker_client(address) as client:
        try:
            containers = await client.containers.list(all=True, filters={"label": [LABEL]})
        except Exception:
            return removed
        for container in containers:
            labels = (container["Labels"] or {}) if "Labels" in container else {}
            if labels.get(LABEL) not in live_runs:
                with contextlib.suppress(Exception):
                    await container.delete(force=True)
                    removed.append(f"container {container.id[:12]}")
        for image in await client.images.list(filters={"label": [LABEL]}):
            if ((image.get("Labels") or {}).get(LABEL)) not in live_runs:
                with contextlib.suppress(Exception):
                    await client.images.delete(image["Id"], force=True)
                    removed.append(f"image {image['Id'][7:19]}")
    return removed

"""A run's workspaces: the state directory, the layer pool, the parent cgroup, the base image, the nursery.

Owns: starting and stopping a run (including the clean-up of runs whose engine died), creating first
workspaces and workspaces restored from durable images (``image_files.py``), and the per-run memory figure.
Everything about individual hosts (starting, watching, removing) and the run's task scope is ``Hosts``'s; forks are
the backend's (``fork/``, chosen in ``fork/registry.py``).
Must never: leave a process, mount, cgroup or layer behind when ``close()`` returns, cancelled or not.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from ..errors import HostUnsupported
from ..images.docker_roots import DEFAULT_SOCKET, DockerRef, DockerRoots, is_docker_ref
from ..images.store import ImageStore
from ..records import AppSpec, Limits, MemoryStats
from . import await_points, image_files
from .base_images import BaseImages
from .cgroups import Cgroup, CgroupLayout
from .cleanup import engine_record, register, registered_live_runs, remove_stale_runs, unregister
from .docker_hosts import DockerHosts, remove_stale
from .docker_images import DockerImages
from .fast_moves import FastMoves
from .fork.docker import DockerCommitFork
from .fork.registry import check_backend, make_backend
from .host_workspace import HostWorkspace
from .hosts import Hosts, RunResources
from .image import runtime_paths
from .ksm import KsmHold, KsmTuning
from .layers import LayerStore
from .memory import RunMemory, processes_memory, run_memory
from .nursery import Nursery
from .shells import DEFAULT_SHELLS
from .task_scope import run_to_end
from .warm_pool import DEFAULT_SIZE, PoolStats

RUNTIMES = ("native", "docker")
DEFAULT_STATE_DIR = Path(os.environ.get("BUNSHIN_STATE_DIR", "/var/lib/bunshin"))
START_TIMEOUT_S = 60.0


class WorkspaceRuntime:
    """Async context manager: ``async with WorkspaceRuntime(backend="cow") as rt: ws = await rt.create(app)``."""

    def __init__(self, *, backend: str = "cow", image: str | Path | None = None, limits: Limits | None = None,
                 seed: int = 0, state_dir: Path | None = None, faults: list[str] | None = None,
                 start_timeout_s: float = START_TIMEOUT_S, warm_pool: int = DEFAULT_SIZE,
                 warm_budget_bytes: int | None = None, ksm: KsmTuning | None = None,
                 image_store: ImageStore | None = None, fast_cgroup_moves: bool = True,
                 one_step_clones: bool = True, prepared_shells: int = DEFAULT_SHELLS,
                 docker_roots: DockerRoots | None = None, runtime: str = "native", docker_address: str | None = None):
        """``start_timeout_s``: how long a new host (a create, a clone, a restore) may take to report ready; an
        engine starting many at once on few cores raises it. ``warm_pool``: ready slots kept per warm app (the
        browsers of Chromium workspaces' live clones, ``warm_pool.py``; 0: every clone starts its own) within
        ``warm_budget_bytes`` of the run's memory charge (None: half of the memory available at the start).
        ``ksm``: ksmd's scan rate while a workspace of the run opts into KSM (``AppSpec.merge_memory``; None: the
        default ``KsmTuning``); the host's own settings are given back when the run closes (``ksm.py``).
        ``image``: an image directory or tarball every workspace stands on, or a local Docker image
        (``docker:NAME[:TAG]``, its root extracted into ``docker_roots``' cache once per image id; None: each app's
        declared image, ``AppSpec.image``, from ``image_store``, by default ``BUNSHIN_IMAGE_DIR``; ``base_images.py``).
        ``fast_cgroup_moves``: put the kernel in its favordynmods mode for the run (``fast_moves.py``; False: leave
        the kernel's mode as it is). ``one_step_clones``: a live clone is forked in one step where it can be
        (``fork/sibling.py``; False: the double fork, for comparison). ``prepared_shells``: live clones' cgroups
        and namespaces kept ready within the warm pool's budget (``shells.py``; 0: every fork makes its own).
        ``runtime="docker"``: every workspace a Docker container on the daemon at ``docker_address`` (default: the
        local socket), forked by a fresh container from the source's committed files with its app's state restored
        (``docker_hosts.py``, ``fork/docker.py``); its image a Docker image (``image="docker:NAME"``, or the app's
        declared image imported into the daemon); ``backend`` is then ``docker``."""
        if runtime not in RUNTIMES:
            raise ValueError(f"unknown runtime {runtime!r} (known: {', '.join(RUNTIMES)})")
        self.runtime_kind = runtime
        self.docker_address = docker_address or DEFAULT_SOCKET
        self.backend_name = "docker" if runtime == "docker" else check_backend(backend)
        self.image_source: Path | DockerRef | None = (
            DockerRef.parse(str(image)) if is_docker_ref(str(image)) else Path(image)) if image else None
        self.docker_roots = docker_roots
        if runtime == "docker" and self.image_source is not None and not isinstance(self.image_source, DockerRef):
            raise ValueError(f"under the docker runtime a workspace's image is a Docker image (docker:NAME), "
                             f"not {image}")
        self.image_store = image_store
        self.limits = limits or Limits()
        self.seed = seed
        self.state_dir = Path(state_dir or DEFAULT_STATE_DIR)
        self.faults = list(faults or [])
        self.start_timeout_s = start_timeout_s
        if warm_pool < 0:
            raise ValueError(f"warm_pool is a count of slots per warm app, got {warm_pool}")
        self.warm_pool, self.warm_budget_bytes = warm_pool, warm_budget_bytes
        self.ksm_tuning = ksm
        self.fast_cgroup_moves = fast_cgroup_moves
        self.one_step_clones = one_step_clones
        if prepared_shells < 0:
            raise ValueError(f"prepared_shells is a count of shells, got {prepared_shells}")
        self.prepared_shells = prepared_shells
        self.run_id = f"{time.strftime('%Y%m%d%H%M%S')}-{secrets.token_hex(3)}"
        self.run_dir = self.state_dir / "runs" / self.run_id
        self.hosts: Hosts | None = None
        self._started = False

    @property
    def workspaces(self) -> dict[str, HostWorkspace]:
        """Every live workspace of the run, by id."""
        return self.hosts.workspaces if self.hosts is not None else {}

    def warm_pool_stats(self) -> PoolStats:
        """The warm pool's counts so far (hits, misses, slots started...; all zero before ``start``)."""
        return self.hosts.pool.stats if self.hosts is not None else PoolStats()

    def shell_stats(self) -> PoolStats:
        """The prepared shells' counts so far (``shells.py``; all zero before ``start``)."""
        return self.hosts.shells.stats if self.hosts is not None else PoolStats()

    # -- run lifecycle -----------------------------------------------------------------------------------------
    async def __aenter__(self) -> WorkspaceRuntime:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        if os.geteuid() != 0:
            raise HostUnsupported("the workspace runtime needs root (namespaces, mounts, cgroups)")
        if self.runtime_kind == "docker":  # a dead run's containers first: their processes are in its cgroups
            await remove_stale(self.docker_address, await asyncio.to_thread(registered_live_runs))
        await asyncio.to_thread(remove_stale_runs, self.state_dir)
        # The run directory appears with its engine.json already inside, so a second engine starting at the same
        # moment never sees it half-made (and so dead).
        staging = self.run_dir.with_name(f".{self.run_id}")
        staging.mkdir(parents=True)
        record = engine_record(self.run_id, os.getpid())
        (staging / "engine.json").write_text(record)
        register(self.run_id, record)
        staging.rename(self.run_dir)
        self._started = True
        self.ksm = KsmHold(self.run_id, registered_live_runs, self.ksm_tuning)
        self.fast_moves = FastMoves(self.run_dir)
        try:
            if self.fast_cgroup_moves:
                await asyncio.to_thread(self.fast_moves.hold)
            self.nursery = Nursery(str(self.run_dir / "nursery.log"), str(self.run_dir))
            await self.nursery.start()
            self.layout = CgroupLayout.detect()
            self.cgroup = Cgroup(self.layout, f"bunshin-{self.run_id}").create(delegate=True)
            self.layers = await asyncio.to_thread(LayerStore.create_pool, self.run_dir)
            self.images = BaseImages(self.layers.root, self.image_source, self.image_store, self.docker_roots)
            if self.image_source is not None and self.runtime_kind == "native":  # a user's image is checked (and
                # copied) before the first workspace
                await self.images.for_app(AppSpec())
            self.pool_fd = self.layers.open_detached()
            self.cgroup_fds = [os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) for d in self.cgroup.dirs()]
            run = RunResources(run_dir=self.run_dir, seed=self.seed, limits=self.limits, faults=self.faults,
                               start_timeout_s=self.start_timeout_s, nursery=self.nursery, cgroup=self.cgroup,
                               layers=self.layers, images=self.images, runtime_binds=runtime_paths(),
                               pool_fd=self.pool_fd, cgroup_fds=self.cgroup_fds, warm_pool=self.warm_pool,
                               warm_budget_bytes=self.warm_budget_bytes, ksm=self.ksm,
                               one_step_clones=self.one_step_clones, shells=self.prepared_shells)
            if self.runtime_kind == "docker":
                given = self.image_source if isinstance(self.image_source, DockerRef) else None
                docker = DockerHosts(run, lambda hosts: DockerCommitFork(cast(DockerHosts, hosts)),
                                     DockerImages(self.docker_address, given, self.image_store), self.run_id,
                                     self.docker_address)
                self.hosts = docker
                await docker.open()
            else:
                self.hosts = Hosts(run, lambda hosts: make_backend(self.backend_name, hosts))
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Close every workspace, then remove the run's cgroup, pool and directory. Finishes under cancellation."""
        if not self._started:
            return
        self._started = False
        await asyncio.shield(self._teardown())

    async def _teardown(self) -> None:
        """Every step runs even when an earlier one failed; the first failure is raised at the end."""
        await await_points.reached("runtime.close")
        errors: list[BaseException] = []

        async def step(coro: Any) -> None:
            try:
                await coro
            except Exception as exc:
                errors.append(exc)

        if self.hosts is not None:
            for ws in list(self.hosts.workspaces.values()):
                await step(ws.close())
            await step(self.hosts.aclose())
            await step(asyncio.to_thread(self.hosts.images.discard_all))
        if hasattr(self, "nursery"):
            await step(self.nursery.close())
        for fd in getattr(self, "cgroup_fds", []):
            os.close(fd)
        if hasattr(self, "pool_fd"):
            os.close(self.pool_fd)
        if hasattr(self, "cgroup"):
            await step(asyncio.to_thread(self.cgroup.remove))
        if hasattr(self, "layers"):
            await step(asyncio.to_thread(self.layers.destroy_pool))
        if hasattr(self, "ksm"):  # every mergeable program is gone: the host's ksmd settings back (if the last)
            await step(asyncio.to_thread(self.ksm.give_back))
        if hasattr(self, "fast_moves"):
            await step(asyncio.to_thread(self.fast_moves.give_back))
        await asyncio.to_thread(shutil.rmtree, self.run_dir, ignore_errors=True)
        unregister(self.run_id)
        if errors:
            raise errors[0]

    # -- workspaces -----------------------------------------------------------------------------------------------
    def prepare(self, app: AppSpec) -> None:
        """Get ready to fork workspaces of ``app``: the warm pool starts filling the slots their live clones take
        (in the background, within its budget; nothing for an app without slots or a backend that takes none), so
        that the first forks of a run find a browser ready."""
        self._hosts().prepare(app)

    def _hosts(self) -> Hosts:
        if self.hosts is None:
            raise RuntimeError("the runtime is not started (use `async with WorkspaceRuntime(...)` or start())")
        return self.hosts

    async def create(self, app: AppSpec | None = None, *, seed: int | None = None,
                     hostname: str | None = None) -> HostWorkspace:
        """Build a new workspace from the image and start its application."""
        hosts = self._hosts()
        ws_id = hosts.new_id()
        if isinstance(hosts, DockerHosts):  # a container: its files are its image's and its own writable layer
            return await hosts.start(ws_id, "", app or AppSpec(), seed=seed, hostname=hostname)
        layer = f"ws-{ws_id}"
        await await_points.reached("runtime.create.layer")
        await run_to_end(asyncio.to_thread(self.layers.create, layer),  # the thread runs on even if we are cancelled
                         undo=lambda _: asyncio.to_thread(self.layers.delete, layer))  # and is undone once done
        return await hosts.start(ws_id, layer, app or AppSpec(), seed=seed, hostname=hostname)

    async def restore_image(self, app: AppSpec, parts: Sequence[image_files.Buffer] | None,
                            fill_layer: image_files.FillLayer, *, seed: int | None = None,
                            frozen: bool = False) -> HostWorkspace:
        """A new workspace (a Snapshot if ``frozen``) restored from a durable image, whatever the run's fork backend
        (it forks with the run's backend afterwards).

        ``parts``: the image's files whole (``WorkspaceImage.read_parts()``: the host's, then each worker's).
        ``fill_layer(upper)`` runs in a thread and fills the new layer's empty overlayfs upper directory; when
        ``parts`` is None it must return the parts, so one ``lambda t: store.read_node(node, t)`` gives both.
        The parts are written back to the pool's dumps tmpfs, verified, read by the new host, and removed once it
        is ready or has failed. Raises ImageCorrupt (a part fails its checks), WorkspaceStartFailed (``fill_layer``
        raised: it is the ``__cause__``; or the app could not restore); on any failure or cancellation nothing of
        the workspace is left."""
        hosts = self._hosts()
        ws_id = hosts.new_id()

        async def start(layer: str, restore_from: str, workers: int) -> HostWorkspace:
            return await hosts.start(ws_id, layer, app, seed=seed, hostname=None, restore_from=restore_from,
                                     restore_workers=workers, frozen=frozen)

        return await image_files.restore(hosts.layers, ws_id, parts, fill_layer, start)

    def memory(self) -> MemoryStats:
        """Every workspace of the run together (PSS summed over all their processes)."""
        if not hasattr(self, "cgroup"):
            return MemoryStats()
        return processes_memory(self.cgroup.procs(), self.cgroup.memory_charge())

    def memory_charge(self) -> int:
        """The run's cgroup charge now (every workspace, shared pages counted once): cheap, one file read."""
        return self.cgroup.memory_charge()

    def memory_detail(self) -> RunMemory:
        """The run's memory by both measures, its page tables, and the engine's and nursery's own (blocking: it
        reads every process of the run; call it in a thread)."""
        if not hasattr(self, "cgroup"):
            return RunMemory()
        return run_memory(self.cgroup.procs(), self.cgroup.memory_charge(), self.cgroup.shmem(),
                          getattr(self.nursery, "pid", None))

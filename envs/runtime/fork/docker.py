"""The fork of a Docker run (``--runtime docker``): a fresh container from the source's committed files, its app's
state restored from a dump, because Docker forks no running process.

The source's host dumps its app's and workers' state as the private-restore baseline's does (``checkpoint.py``,
into the dumps tmpfs bound in every container), then the engine commits the source's container (``docker commit``,
which pauses it while its writable layer is copied into a new image, labelled with the run); a clone is a new
container of that image whose host reads the dump back into private memory. One dump and one commit serve every
fork of one state (``restore.py``'s bookkeeping); both go once no fork reads them. Nothing is shared with the source
but what KSM merges, for a workspace that opts in (``AppSpec.merge_memory``), and the image's read-only layers.
Owns: the commit and the removal of committed images.
Must never: leave a committed image behind once its dump is retired, or commit a source whose dump failed.
"""

from __future__ import annotations

import asyncio
import contextlib

from ...errors import ForkFailed
from ..docker_hosts import LABEL, DockerHosts
from ..host_workspace import HostWorkspace
from .restore import Dump, PrivateRestore


class DockerCommitFork(PrivateRestore):
    name = "docker"

    def __init__(self, hosts: DockerHosts) -> None:
        super().__init__(hosts)
        self.docker_hosts = hosts

    async def _files_taken(self, source: HostWorkspace, dump: Dump) -> None:
        hosts = self.docker_hosts
        container_id = hosts.containers.get(source.pid, "")
        try:
            answer = await hosts.client.containers.container(container_id).commit(
                config={"Labels": {LABEL: hosts.run_id, "bunshin.dump": dump.path}}, pause=True)
        except Exception as exc:
            raise ForkFailed(source.id, f"commit of its container {container_id[:12]} failed: {exc}") from exc
        dump.layer = str(answer["Id"])
        hosts.docker_images.committed(dump.layer, getattr(source, "image_ref", ""))

    async def _clone_files(self, dump: Dump, clone_id: str) -> str:
        return dump.layer  # the clone's container starts from the committed image

    async def _discard_dump(self, dump: Dump) -> None:
        await asyncio.shield(self._discard_images(dump))

    async def _discard_images(self, dump: Dump) -> None:
        if dump.removed:
            return
        dump.removed = True
        await asyncio.to_thread(self._remove_images, dump)
        if dump.layer.startswith("sha256:"):
            hosts = self.docker_hosts
            hosts.docker_images.forget(dump.layer)
            if hosts.client is not None:
                with contextlib.suppress(Exception):  # the run's close removes what is left by its label
                    await hosts.client.images.delete(dump.layer, force=True)

"""Which image each workspace of a run stands on, placed in the run's pool once, on first use.

Owns: the choice (the image the runtime was given, for every workspace, when it was given one; else the declared
image the app names, ``AppSpec.image``, which must be built in the image store, ``envs/images``; else the
host-derived default) and the run's placed images by name (``image.py`` places them). Either choice may be a local
Docker image, ``docker:NAME[:TAG]``: its root comes from the Docker cache (``images/docker_roots.py``, extracted
once per image id) and is placed as a declared image's is, with the image's own configuration beside it.
Must never: build an image (minutes and the network: that is the setup's and ``bunshin images build``'s), nor
place one twice in a run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
from pathlib import Path

from ..images.docker_roots import DockerRef, DockerRoot, DockerRoots, is_docker_ref
from ..images.recipes import recipe
from ..images.store import ImageStore
from ..records import AppSpec
from .image import (
    ImageError,
    PreparedImage,
    build_default_image,
    place_declared,
    place_directory,
    place_root,
    place_tarball,
)

HOST_DEFAULT = "host"  # the name under which the host-derived default is placed


class BaseImages:
    """The run's images. ``given``: the image directory or tarball the runtime was started with (None: each app's
    own); ``store``: where declared images are looked up."""

    def __init__(self, pool_root: Path, given: Path | DockerRef | None = None, store: ImageStore | None = None,
                 docker: DockerRoots | None = None):
        self.pool_root = pool_root
        self.given = given
        self.store = store or ImageStore()
        self.docker = docker or DockerRoots()
        self.placed: dict[str, PreparedImage] = {}
        self._placing: dict[str, asyncio.Lock] = {}

    def name_for(self, app: AppSpec) -> str:
        """The name of the image ``app``'s workspaces stand on in this run."""
        if self.given is not None:
            return f"given:{self.given}"
        return app.image or HOST_DEFAULT

    async def for_app(self, app: AppSpec) -> PreparedImage:
        """The image ``app``'s workspaces stand on, placed in the pool (``UnknownImage``, ``ImageNotBuilt``: the
        app names an image no recipe declares, or one not built here; for a Docker image ``DockerUnavailable``,
        ``DockerImageMissing``, ``DockerImportFailed``, or ``ImageError`` when it cannot carry a workspace)."""
        name = self.name_for(app)
        if name in self.placed:
            return self.placed[name]
        lock = self._placing.setdefault(name, asyncio.Lock())
        async with lock:
            if name not in self.placed:
                docker = self._docker_ref(app)
                if docker is not None:
                    root = await self.docker.get(docker)
                    self.placed[name] = await asyncio.to_thread(_place_docker, self.pool_root, root)
                else:
                    self.placed[name] = await asyncio.to_thread(self._place, app)
        return self.placed[name]

    def _docker_ref(self, app: AppSpec) -> DockerRef | None:
        if isinstance(self.given, DockerRef):
            return self.given
        if self.given is None and is_docker_ref(app.image):
            return DockerRef.parse(str(app.image))
        return None

    def _place(self, app: AppSpec) -> PreparedImage:
        if isinstance(self.given, Path):
            if self.given.is_dir():
                return place_directory(self.pool_root, self.given)
            return place_tarball(self.pool_root, self.given)
        if app.image is None:
            return build_default_image(self.pool_root)
        return place_declared(self.pool_root, self.store.require(recipe(app.image)))


def _place_docker(pool_root: Path, root: DockerRoot) -> PreparedImage:
    """A Docker image's cached root in the pool, as a declared image (its /usr bound from the cache), carrying the
    image's configuration. What a workspace needs of its image is checked here, by name, rather than failing at its
    first command or a lazy import: /bin/sh (agent commands run in it) and, when the runtime's interpreter lives
    under /usr (Debian's python3), that Python's standard library, which the host then imports from the image."""
    missing = [] if (root.root / "bin" / "sh").exists() or (root.root / "usr" / "bin" / "sh").exists() else [
        "/bin/sh (agent commands run in it)"]
    stdlib = f"usr/lib/python{sys.version_info.major}.{sys.version_info.minor}"
    if os.path.realpath(sys.base_prefix).startswith("/usr") and not (root.root / stdlib).is_dir():
        missing.append(f"/{stdlib} (the workspace host runs on the image's Python {sys.version_info.major}."
                       f"{sys.version_info.minor}: Debian 12's python3)")
    if missing:
        raise ImageError(f"docker:{root.ref}: the image lacks {' and '.join(missing)}")
    placed = place_root(pool_root, root.root, key=f"docker-{root.image_id[:16]}", label=f"docker:{root.ref}")
    return dataclasses.replace(placed, config=root.config)

"""Which Docker image each container of a Docker run starts from, and what that image says of its programs.

Owns: the choice, as ``base_images.py`` makes it for our own runtime (the image the runtime was given, a
``docker:NAME`` reference, for every workspace; else the app's: a ``docker:NAME`` reference as it is, a declared
image imported into the daemon once per digest as ``bunshin/<name>:<digest>``, ``images/docker_daemon.py``); each
image's ``Env`` and ``WorkingDir`` for agent commands, a committed image (a fork's) answering with its origin's.
Must never: build a declared image (that is the setup's), or pull from a registry.
"""

from __future__ import annotations

import asyncio

from ..images.docker_daemon import import_declared
from ..images.docker_roots import DockerRef, ImageConfig, docker_client, is_docker_ref, translate
from ..images.recipes import recipe
from ..images.store import ImageStore
from ..records import AppSpec
from .image import ImageError


class DockerImages:
    """A Docker run's images, by reference. ``given``: the image every workspace stands on (None: each app's)."""

    def __init__(self, address: str, given: DockerRef | None = None, store: ImageStore | None = None):
        self.address = address
        self.given = given
        self.store = store or ImageStore()
        self.configs: dict[str, ImageConfig] = {}
        self.origins: dict[str, str] = {}  # a committed image -> the image its source started from
        self._resolving: dict[str, asyncio.Lock] = {}
        self.resolved: dict[str, str] = {}

    async def for_app(self, app: AppSpec) -> str:
        """The Docker image ``app``'s containers start from (imported if it is a declared image the daemon lacks;
        ``ImageNotBuilt``, ``DockerImageMissing``, ``DockerUnavailable``, ``ImageError``)."""
        key = str(self.given) if self.given is not None else (app.image or "")
        if key in self.resolved:
            return self.resolved[key]
        async with self._resolving.setdefault(key, asyncio.Lock()):
            if key not in self.resolved:
                self.resolved[key] = await self._resolve(key)
        return self.resolved[key]

    async def _resolve(self, key: str) -> str:
        if is_docker_ref(key):
            ref = DockerRef.parse(key)
        elif key:
            ref = await import_declared(self.store.require(recipe(key)), address=self.address)
        else:
            raise ImageError("under --runtime docker a workspace needs an image: the app names none (the host's "
                             "own /usr has no Docker form); give --image docker:NAME or a declared image")
        async with docker_client(self.address) as client:
            try:
                info = await client.images.inspect(ref.name)
            except Exception as exc:
                raise translate(exc, ref, self.address) from exc
        self.configs[ref.name] = ImageConfig.from_inspect(info.get("Config"))
        return ref.name

    def committed(self, image_id: str, source_image: str) -> None:
        """A fork's committed image, whose configuration is its source's image's (Docker's would be ours)."""
        self.origins[image_id] = self.origins.get(source_image, source_image)

    def forget(self, image_id: str) -> None:
        self.origins.pop(image_id, None)

    def config(self, ref: str) -> ImageConfig:
        return self.configs.get(self.origins.get(ref, ref), ImageConfig())

    def config_env(self, ref: str) -> dict[str, str]:
        return dict(self.config(ref).env)

    def config_cwd(self, ref: str) -> str:
        return self.config(ref).working_dir

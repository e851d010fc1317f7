"""Which image each workspace of a run stands on, placed in the run's pool once, on first use.

Owns: the choice (the image the runtime was given, for every workspace, when it was given one; else the declared
image the app names, ``AppSpec.image``, which must be built in the image store, ``envs/images``; else the
host-derived default) and the run's placed images by name (``image.py`` places them).
Must never: build an image (minutes and the network: that is the setup's and ``bunshin images build``'s), nor
place one twice in a run.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from ..images.recipes import recipe
from ..images.store import ImageStore
from ..records import AppSpec
from .image import PreparedImage, build_default_image, place_declared, place_directory, place_tarball

HOST_DEFAULT = "host"  # the name under which the host-derived default is placed


class BaseImages:
    """The run's images. ``given``: the image directory or tarball the runtime was started with (None: each app's
    own); ``store``: where declared images are looked up."""

    def __init__(self, pool_root: Path, given: Path | None = None, store: ImageStore | None = None):
        self.pool_root = pool_root
        self.given = given
        self.store = store or ImageStore()
        self.placed: dict[str, PreparedImage] = {}
        self._placing: dict[str, asyncio.Lock] = {}

    def name_for(self, app: AppSpec) -> str:
        """The name of the image ``app``'s workspaces stand on in this run."""
        if self.given is not None:
            return f"given:{self.given}"
        return app.image or HOST_DEFAULT

    async def for_app(self, app: AppSpec) -> PreparedImage:
        """The image ``app``'s workspaces stand on, placed in the pool (``UnknownImage``, ``ImageNotBuilt``: the
        app names an image no recipe declares, or one not built here)."""
        name = self.name_for(app)
        if name in self.placed:
            return self.placed[name]
        lock = self._placing.setdefault(name, asyncio.Lock())
        async with lock:
            if name not in self.placed:
                self.placed[name] = await asyncio.to_thread(self._place, app)
        return self.placed[name]

    def _place(self, app: AppSpec) -> PreparedImage:
        if self.given is not None:
            if self.given.is_dir():
                return place_directory(self.pool_root, self.given)
            return place_tarball(self.pool_root, self.given)
        if app.image is None:
            return build_default_image(self.pool_root)
        return place_declared(self.pool_root, self.store.require(recipe(app.image)))

"""What each declared workspace image holds: a Debian release, its archive, and a package list.

Owns: the ``ImageRecipe`` record, its digest (the cache key: the same recipe gives the same digest on every host),
and the table of the images the embedded suites run on (``RECIPES``). A suite names its image in its ``AppSpec``
(``image``); docs/images.md lists them.
Must never: depend on what the host has installed (a recipe is data; building it is ``store.py``'s).
"""

from __future__ import annotations

import hashlib

import msgspec

from ..errors import EnvsError

# Bumped whenever what the builder does to a recipe changes (its options, the customisation after the install),
# so that images built the old way are not taken for the new.
BUILD_FORMAT = 1

DEBIAN_SOURCES = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)


class ImageRecipe(msgspec.Struct, frozen=True, kw_only=True):
    """A root file system: Debian ``release``'s ``minbase`` variant (essential packages and apt) plus ``packages``,
    installed from ``sources`` without recommends (what a package merely recommends differs with the archive's
    day; what is listed is what a task finds). A package may be pinned ``name=version``."""

    name: str
    description: str
    packages: tuple[str, ...]
    release: str = "bookworm"
    sources: tuple[str, ...] = DEBIAN_SOURCES

    def digest(self) -> str:
        """sha256 of everything that decides the image's contents (not its description), hex."""
        key = {"format": BUILD_FORMAT, "release": self.release, "sources": list(self.sources),
               "packages": sorted(set(self.packages))}
        return hashlib.sha256(msgspec.json.encode(key)).hexdigest()

    def key(self) -> str:
        """The image's directory name in the store: ``<name>-<first 16 hex digits of the digest>``."""
        return f"{self.name}-{self.digest()[:16]}"


# python3: the agent's interpreter (tasks run ``python3``), and the libraries the runtime's own interpreter links
# (libssl, libffi, libsqlite3, zlib...: the runtime's Python is bound into every workspace, its libraries are not)
BASE_PACKAGES = ("python3",)

RECIPES: dict[str, ImageRecipe] = {recipe.name: recipe for recipe in (
    ImageRecipe(name="base", packages=BASE_PACKAGES,
                description="Debian 12 minbase and python3: the text-browser web shop and the drawn desktop"),
    ImageRecipe(name="chromium", packages=(*BASE_PACKAGES, "chromium", "fonts-liberation"),
                description="base and Debian's Chromium with the Liberation fonts: the web shop in Chromium"),
)}


class UnknownImage(EnvsError, KeyError):
    """An image name no recipe declares."""

    def __str__(self) -> str:
        return str(self.args[0])


def recipe(name: str) -> ImageRecipe:
    """The declared image called ``name`` (``UnknownImage`` listing the known ones)."""
    try:
        return RECIPES[name]
    except KeyError:
        raise UnknownImage(f"unknown workspace image {name!r}; declared: {', '.join(sorted(RECIPES))}") from None

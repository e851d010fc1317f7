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
    day; what is listed is what a task finds). A package may be pinned ``name=version``. ``pip``: Python packages
    the archive lacks, each pinned ``name==version`` and installed without dependencies (so the list is all there
    is) into the image's /usr/local for its python3."""

    name: str
    description: str
    packages: tuple[str, ...]
    pip: tuple[str, ...] = ()
    release: str = "bookworm"
    sources: tuple[str, ...] = DEBIAN_SOURCES

    def __post_init__(self) -> None:
        loose = [p for p in self.pip if "==" not in p]
        if loose:
            raise ValueError(f"image {self.name}: pip packages must be pinned name==version: {loose}")

    def digest(self) -> str:
        """sha256 of everything that decides the image's contents (not its description), hex."""
        key: dict[str, object] = {"format": BUILD_FORMAT, "release": self.release, "sources": list(self.sources),
               "packages": sorted(set(self.packages))}
        if self.pip:  # (absent when empty: the digests of images without pip packages stay what they were)
            key["pip"] = sorted(set(self.pip))
        return hashlib.sha256(msgspec.json.encode(key)).hexdigest()

    def key(self) -> str:
        """The image's directory name in the store: ``<name>-<first 16 hex digits of the digest>``."""
        return f"{self.name}-{self.digest()[:16]}"


# python3: the agent's interpreter (tasks run ``python3``), and the libraries the runtime's own interpreter links
# (libssl, libffi, libsqlite3, zlib...: the runtime's Python is bound into every workspace, its libraries are not)
BASE_PACKAGES = ("python3",)

# OSWorld's desktop (docs/osworld.md): the display, the window manager and its tools, the accessibility bus, the
# apps its tasks use (VS Code is not in Debian), the fonts and a locale; pyautogui for OSWorld's /execute, which
# runs ``python -c "import pyautogui; ..."`` (its Debian dependencies here, itself and the rest from pip)
DESKTOP_PACKAGES = (
    *BASE_PACKAGES, "python-is-python3", "xvfb", "openbox", "wmctrl", "xdotool", "scrot", "x11-utils", "dbus-x11",
    "at-spi2-core", "python3-pyatspi", "python3-xlib", "python3-pil", "python3-tk", "libreoffice-calc",
    "libreoffice-writer", "libreoffice-impress", "libreoffice-gtk3", "chromium", "gedit", "vlc", "gimp",
    "thunderbird", "xterm", "gnome-terminal", "ffmpeg", "fonts-liberation", "fonts-dejavu-core", "locales", "tzdata",
    "xdg-utils", "socat", "libglib2.0-bin", "dconf-gsettings-backend", "gsettings-desktop-schemas",
)
PYAUTOGUI = ("pyautogui==0.9.54", "pymsgbox==1.0.9", "pytweening==1.2.0", "pyscreeze==1.0.1", "pygetwindow==0.0.9",
             "pyrect==0.2.0", "mouseinfo==0.1.3", "pyperclip==1.9.0")

RECIPES: dict[str, ImageRecipe] = {recipe.name: recipe for recipe in (
    ImageRecipe(name="base", packages=BASE_PACKAGES,
                description="Debian 12 minbase and python3: the text-browser web shop and the drawn desktop"),
    ImageRecipe(name="chromium", packages=(*BASE_PACKAGES, "chromium", "fonts-liberation"),
                description="base and Debian's Chromium with the Liberation fonts: the web shop in Chromium"),
    ImageRecipe(name="desktop", packages=DESKTOP_PACKAGES, pip=PYAUTOGUI,
                description="an X desktop: Xvfb, openbox, D-Bus and AT-SPI, LibreOffice, Chromium, gedit, VLC, "
                            "GIMP, Thunderbird, GNOME Terminal, xterm, ffmpeg, pyautogui: the osworld suite"),
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

"""``bunshin images``: build and list the declared workspace images; build a suite's before a command runs it.

Owns: the command-line face of the image store (``envs/images``): which images a suite's workspaces stand on
(``suite_images``), building the missing ones with progress on stderr, and the table ``images list`` and
``doctor`` print; ``images docker``: built images imported into the local Docker daemon.
Must never: start a run (building is done, or refused, before any workspace exists).
"""

from __future__ import annotations

import sys

from bunshin.envs.images.docker_roots import DockerError, is_docker_ref
from bunshin.envs.images.recipes import RECIPES, ImageRecipe, recipe
from bunshin.envs.images.store import ImageBuildFailed, ImageStore
from bunshin.envs.records import AppSpec
from bunshin.envs.suites.base import Suite

from ..errors import CommandError


def progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def app_images(app: AppSpec) -> list[str]:
    """The declared images ``app``'s workspaces and its warm-pool slots stand on."""
    names = [spec.image for spec in (app, app.warm)
             if spec is not None and spec.image is not None and not is_docker_ref(spec.image)]
    return list(dict.fromkeys(names))


def suite_images(suite: Suite) -> list[str]:
    """The declared images a run of ``suite`` (as its knobs configure it) needs."""
    return app_images(suite.app())


def build(names: list[str], store: ImageStore | None = None) -> list[str]:
    """Build the images called ``names`` that are not built yet (``CommandError`` naming the one that failed);
    the ones built now."""
    store = store or ImageStore()
    made = []
    for name in names:
        wanted = _recipe(name)
        if store.find(wanted) is not None:
            continue
        try:
            store.build(wanted, progress)
        except ImageBuildFailed as exc:
            raise CommandError(str(exc)) from exc
        made.append(name)
    return made


async def to_docker(names: list[str], store: ImageStore | None = None) -> list[str]:
    """Import the built images called ``names`` into the local Docker daemon as ``bunshin/<name>:<digest>``
    (unless it has them); their Docker names (``CommandError``: one not built, or the daemon's refusal)."""
    from bunshin.envs.images.docker_daemon import import_declared

    store = store or ImageStore()
    refs = []
    for name in names:
        built = store.find(_recipe(name))
        if built is None:
            raise CommandError(f"image {name} is not built: bunshin images build {name}")
        try:
            refs.append(str(await import_declared(built, progress=progress)))
        except DockerError as exc:
            raise CommandError(str(exc)) from exc
    return refs


def prune(store: ImageStore | None = None) -> list[str]:
    """Remove the images no declared recipe names any more (and killed builds' leftovers)."""
    store = store or ImageStore()
    return store.prune({wanted.key() for wanted in RECIPES.values()})


def ensure_suite_images(suite: Suite) -> None:
    """Before a command runs ``suite``: build its images that are not built (the first run on a machine that skipped
    scripts/setup.sh pays the build once, with progress, instead of failing at its first workspace)."""
    build(suite_images(suite))


def table(store: ImageStore | None = None) -> list[str]:
    """One line per declared image: built or not, what it holds, where."""
    store = store or ImageStore()
    lines = []
    for name, wanted in sorted(RECIPES.items()):
        built = store.find(wanted)
        if built is None:
            state = f"not built (bunshin images build {name})"
        else:
            m = built.manifest
            state = (f"built {m.built_at}, {len(m.packages)} packages, {m.size_bytes / 2**20:.0f} MiB, "
                     f"in {built.path}")
        lines.append(f"image {name:10} {wanted.key():28} {state}; {wanted.description}")
    return lines


def _recipe(name: str) -> ImageRecipe:
    try:
        return recipe(name)
    except KeyError as exc:
        raise CommandError(str(exc)) from exc


# the configurations of the embedded suites whose workspaces stand on different images
SUITE_VARIANTS: list[tuple[str, dict[str, object], str]] = [
    ("webshop", {}, "text browser"), ("webshop", {"browser": "chromium"}, "--browser chromium"),
    ("desktop", {}, "drawn desktop"), ("osworld", {}, "real desktop"),
]


def suites_table() -> list[str]:
    """One line per embedded suite configuration: the images its workspaces stand on."""
    from bunshin.envs.suites.registry import get_suite

    return [f"suite {name:8} {label:20} image {', '.join(suite_images(get_suite(name, **knobs))) or 'host'}"
            for name, knobs, label in SUITE_VARIANTS]


def images_json(store: ImageStore | None = None) -> dict[str, object]:
    """``doctor --json``'s part: every declared image (built or not, its key and path) and each suite's images."""
    from bunshin.envs.suites.registry import get_suite

    store = store or ImageStore()
    images = {}
    for name, wanted in sorted(RECIPES.items()):
        built = store.find(wanted)
        images[name] = {"key": wanted.key(), "built": built is not None, "path": str(built.path) if built else None,
                        "packages": len(built.manifest.packages) if built else None}
    suites = [{"suite": name, "knobs": knobs, "images": suite_images(get_suite(name, **knobs))}
              for name, knobs, _ in SUITE_VARIANTS]
    return {"images": images, "suites": suites}

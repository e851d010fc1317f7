"""The fork backends of this project, by name: the one module that knows every backend (``bunshin doctor`` says
which can run here).

- ``cow`` (``cow.py``): the userspace live fork. No application memory is copied: clones share every page they do
  not write, and files through btrfs snapshots of the source's writable layer.
- ``kmod`` (``kmod.py``): the tree fork. The engine forks a workspace's whole process tree from outside it through
  the kernel module (its memory shared copy-on-write, its files through a btrfs snapshot); needs the module
  loaded (``/dev/bunshin``), the builder, and cgroup v2.
- ``restore`` (``restore.py``): the private-restore baseline. The source dumps every process's state once per
  state; fresh hosts read the dump back into private memory, as CRIU's restore does.

Owns: ``BACKENDS`` (the names), checking a name, making a run's backend, and which backends carry an application's
programs (``forks_live``). A new backend is a module of this
package implementing ``ForkBackend`` (``backends.py``), listed here.
Must never: be imported by a backend (they depend on ``backends.py`` only).
"""

from __future__ import annotations

from collections.abc import Callable

from ..hosts import Hosts
from .backends import ForkBackend
from .cow import CowFork
from .kmod import KmodFork
from .restore import PrivateRestore

_MAKERS: dict[str, Callable[[Hosts], ForkBackend]] = {"cow": CowFork, "restore": PrivateRestore, "kmod": KmodFork}
BACKENDS = tuple(_MAKERS)


# the backends that fork every process of a workspace, its application's programs too (a browser, an X desktop):
# on them every suite forks live, whatever ``Suite.forks_live`` says of the userspace fork
CARRIES_PROGRAMS = frozenset({"kmod"})


def forks_live(suite_forks_live: bool, backend: str) -> bool:
    """Whether a suite's workspaces fork live on ``backend``."""
    return suite_forks_live or check_backend(backend) in CARRIES_PROGRAMS


def check_backend(name: str) -> str:
    if name not in _MAKERS:
        raise ValueError(f"unknown fork backend {name!r} (known: {', '.join(BACKENDS)})")
    return name


def make_backend(name: str, hosts: Hosts) -> ForkBackend:
    return _MAKERS[check_backend(name)](hosts)

"""Named fault points: steps of a workspace process that a test can break by naming them in the run's ``faults``.

Owns: ``InjectedFault`` and ``fault``: ``name`` raises, ``name:exit`` exits at once (status 66), ``name:hang``
never returns. Used by hosts (``fork/state.py``) and by the nursery's shell holders (``nursery.py``).
Must never: act on a name that is not listed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection

from ..errors import EnvsError


class InjectedFault(EnvsError):
    """A test made a named step fail (``HostConfig.faults``, ``NurseryShell.faults``)."""


def fault(faults: Collection[str], name: str) -> None:
    """The step ``name`` is reached: fail it as ``faults`` asks, if it names it."""
    if name in faults:
        raise InjectedFault(f"injected fault at {name}")
    if f"{name}:exit" in faults:
        os._exit(66)
    if f"{name}:hang" in faults:
        while True:
            time.sleep(3600)

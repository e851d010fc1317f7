"""Named await points: places in the runtime's and the engine's coroutines where a test can step in.

Owns: ``reached(name)``, which a coroutine awaits just before an await that matters (a request on its way to a
host, a fork waiting for its clone, a sample waiting for a decision...), and ``hook(...)``, which lets a test run
a callback there: typically cancelling the task that reached the point, so that the cancellation lands on the very
next await, exactly as a caller's cancellation would. ``seen()`` records which points a run passed, so a test can
cancel at each of them in turn instead of guessing with sleeps.
Must never: cost more than a dictionary lookup when no hook is set, or change behaviour when none is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator

Hook = Callable[[str], Awaitable[None] | None]

_hooks: dict[str, Hook] = {}
_seen: list[list[str]] = []


async def reached(name: str) -> None:
    """Called by the code at the point ``name``; runs the hook set for it (or for ``"*"``), if any."""
    for log in _seen:
        log.append(name)
    hook = _hooks.get(name) or _hooks.get("*")
    if hook is not None:
        result = hook(name)
        if result is not None:
            await result


@contextlib.contextmanager
def hook(callback: Hook, *names: str) -> Iterator[None]:
    """Run ``callback(name)`` at each point in ``names`` (every point when none is given) while the block runs."""
    keys = names or ("*",)
    previous = {k: _hooks.get(k) for k in keys}
    for k in keys:
        _hooks[k] = callback
    try:
        yield
    finally:
        for k, old in previous.items():
            if old is None:
                _hooks.pop(k, None)
            else:
                _hooks[k] = old


@contextlib.contextmanager
def seen() -> Iterator[list[str]]:
    """The names of the points passed while the block runs, in order (repeats included)."""
    log: list[str] = []
    _seen.append(log)
    try:
        yield log
    finally:
        _seen.remove(log)

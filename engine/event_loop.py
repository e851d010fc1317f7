"""Running the engine's coroutines: on uvloop when it is installed (the default), else on asyncio's own loop.

Owns: the choice of event loop for the command line. Embedders bring their own loop; the engine runs on both.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], *, use_uvloop: bool = True) -> T:
    if use_uvloop:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.run(coro)
    return asyncio.run(coro)

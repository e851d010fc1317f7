"""Which suites exist, by name, and how to make one with its knobs.

Owns: the name -> implementation table. Suites are imported lazily: a desktop run never imports the shop.
"""

from __future__ import annotations

import importlib
from typing import Any

from .base import Suite, SuiteError

SUITES = {
    "webshop": "bunshin.envs.webshop.suite:WebShopSuite",
    "desktop": "bunshin.envs.desktop.suite:DesktopSuite",
}


class UnknownSuite(SuiteError, ValueError):
    pass


def get_suite(name: str, **knobs: Any) -> Suite:
    """The suite called ``name``; ``knobs`` are its constructor's keyword arguments (sizes, seeds)."""
    if name not in SUITES:
        raise UnknownSuite(f"unknown suite {name!r}; known: {', '.join(sorted(SUITES))}")
    module, _, cls = SUITES[name].partition(":")
    return getattr(importlib.import_module(module), cls)(**knobs)

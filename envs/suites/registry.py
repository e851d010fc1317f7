"""Which suites exist, by name, and how to make one with its knobs: the one suite registry (policies find a
suite's tool schema here too).

Owns: the name -> implementation table. Suites are imported lazily: a desktop run never imports the shop.
Must never: construct a suite to read what its class declares (``tool_schema``).
"""

from __future__ import annotations

import importlib
from typing import Any

from .base import Suite
from .errors import UnknownSuite
from .tools import ToolSchema

SUITES = {
    "webshop": "bunshin.envs.webshop.suite:WebShopSuite",
    "desktop": "bunshin.envs.desktop.suite:DesktopSuite",
    "osworld": "bunshin.envs.xdesktop.suite:OSWorldSuite",
    "webarena": "bunshin.envs.webarena.suite:WebArenaSuite",
}


def suite_class(name: str) -> type[Suite]:
    """The class of the suite called ``name`` (``UnknownSuite`` listing the known ones)."""
    if name not in SUITES:
        raise UnknownSuite(f"unknown suite {name!r}; known: {', '.join(sorted(SUITES))}")
    module, _, cls = SUITES[name].partition(":")
    kind: type[Suite] = getattr(importlib.import_module(module), cls)
    return kind


def get_suite(name: str, **knobs: Any) -> Suite:
    """The suite called ``name``; ``knobs`` are its constructor's keyword arguments (sizes, seeds)."""
    return suite_class(name)(**knobs)


def tool_schema(name: str) -> ToolSchema | None:
    """The agent tools suite ``name`` declares (None: it declares none)."""
    return suite_class(name).tool_schema

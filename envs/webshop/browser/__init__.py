"""A text browser for the embedded web shop: pages, tabs, history, forms, accessibility tree, screenshots.

Modules: ``dom`` (HTML tree, CSS selector subset, outer text, forms), ``accessibility`` (WebArena's tree text and
the viewport), ``screenshot`` (full-page raster and viewport PNG), ``actions`` (WebArena's action language <->
tool calls), ``browser`` (tabs, history with a back/forward cache, cookies, the actions themselves).
"""

from .actions import format_action, parse_action, validate_call
from .browser import Browser, BrowserError
from .dom import SelectorError

__all__ = ["Browser", "BrowserError", "SelectorError", "format_action", "parse_action", "validate_call"]

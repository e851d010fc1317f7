"""A text browser for the embedded web shop: pages, tabs, history, forms, accessibility tree, screenshots.

Modules: ``dom`` (HTML tree and outer text), ``css`` (the CSS selector subset), ``forms`` (fields, values, a
form's data set), ``accessibility`` (WebArena's tree text and the viewport), ``screenshot`` (full-page raster and
viewport PNG), ``images`` (a page's decoded images), ``loader`` (HTTP with deadlines, size caps, cookie limits),
``actions`` (WebArena's action language <-> tool calls), ``errors`` (``BrowserError``), ``browser`` (tabs,
history with a back/forward cache, the actions themselves). Every bound a hostile page meets is a named constant
in the module that enforces it, documented in that module's docstring.
"""

from .actions import format_action, parse_action, validate_call
from .browser import Browser
from .dom import SelectorError
from .errors import BrowserError

__all__ = ["Browser", "BrowserError", "SelectorError", "format_action", "parse_action", "validate_call"]

"""The text browser's errors: what an agent's action or page did that the browser refuses.

Owns: ``BrowserError`` (a ``ToolError``: the agent sees the message, the workspace goes on; each message is
written for the agent: what was refused and what to do instead) and ``PageSelectorError``.
Must never: carry a foreign exception's text alone (say what the agent did, then why it failed).
"""

from __future__ import annotations

from ...app import ToolError
from .css import SelectorError


class BrowserError(ToolError):
    """The page refused the action (bad element id, not a field, no such tab, site unreachable, page too slow,
    too many tabs or redirects...)."""


class PageSelectorError(BrowserError, SelectorError):
    """``fetch_text`` got a selector outside the supported subset: both a ``BrowserError`` (callers that turn
    browser errors into tool errors catch it) and a ``dom.SelectorError``."""

"""The web shop's agent tools, written once: WebArena's actions as msgspec Structs.

Owns: ``SCHEMA``, what each action is called, takes (arguments in the order the action language writes them, their
types and defaults) and does (the docstrings are the descriptions a model reads). The action language
(``browser/actions.py``), the shop's application (``app.py``) and the OpenAI policy's function definitions and
prompt are all derived from it.
Must never: hold the action language's syntax (``click [12]`` is ``browser/actions.py``'s) or list a tool the shop
does not perform; the shop's internal tools (``_start``, ``_element``...) are not the agent's.
"""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from ..suites.tools import MAX_INT, ToolArgs, ToolSchema, Trimmed

ElementId = Annotated[int, Meta(ge=0, le=MAX_INT, description="The element's id: the number in square brackets "
                                                             "before it in the current page's accessibility tree.")]


class ClickArgs(ToolArgs, kw_only=True):
    """Click the element with this id (a link, a button, a checkbox; a click on a field focuses it)."""

    element_id: ElementId


class HoverArgs(ToolArgs, kw_only=True):
    """Hover over the element with this id."""

    element_id: ElementId


class TypeArgs(ToolArgs, kw_only=True):
    """Type text into the field with this id, replacing what it held (for a drop-down: choose the option with this
    text); then press Enter unless press_enter_after is false."""

    element_id: ElementId
    text: Annotated[str, Meta(description="The text to type.")]
    press_enter_after: Annotated[bool, Meta(description="Press Enter after typing (submits a search box).")] = True


class PressArgs(ToolArgs, kw_only=True):
    """Press a key combination on the focused element, like Enter or Control+a."""

    key_comb: Annotated[Trimmed, Meta(description="The keys, joined by '+': Enter, Backspace, Control+a...")]


class ScrollArgs(ToolArgs, kw_only=True):
    """Scroll the page by one screen."""

    direction: Literal["up", "down"]


class NewTabArgs(ToolArgs, kw_only=True):
    """Open a new, empty tab and switch to it."""


class TabFocusArgs(ToolArgs, kw_only=True):
    """Switch to the tab with this index (the first tab is 0)."""

    tab_index: Annotated[int, Meta(ge=0, le=MAX_INT, description="The tab's index, from 0.")]


class CloseTabArgs(ToolArgs, kw_only=True):
    """Close the current tab; the last open tab gets the focus."""


class GotoArgs(ToolArgs, kw_only=True):
    """Open a URL (or a path on this site) in the current tab."""

    url: Annotated[Trimmed, Meta(description="An http(s) URL or a path such as /checkout/cart/.")]


class GoBackArgs(ToolArgs, kw_only=True):
    """Go back to the previous page of the current tab."""


class GoForwardArgs(ToolArgs, kw_only=True):
    """Go forward to the next page of the current tab (after go_back)."""


class StopArgs(ToolArgs, kw_only=True):
    """Finish the task, with the answer if the task asks for one; answer N/A if the task cannot be done."""

    answer: Annotated[str, Meta(description="The answer; empty when there is nothing to answer.")] = ""


SCHEMA = ToolSchema({
    "click": ClickArgs,
    "hover": HoverArgs,
    "type": TypeArgs,
    "press": PressArgs,
    "scroll": ScrollArgs,
    "new_tab": NewTabArgs,
    "tab_focus": TabFocusArgs,
    "close_tab": CloseTabArgs,
    "goto": GotoArgs,
    "go_back": GoBackArgs,
    "go_forward": GoForwardArgs,
    "stop": StopArgs,
})
FINAL = "stop"  # the tool that ends an episode: the suite scores it, the browser never performs it

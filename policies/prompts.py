"""What a model is told: the system prompts, the ``act`` tool, the suites' tools as functions, and reading an action
out of a model's text.

Owns: ``DEFAULT_PROMPTS`` (one system prompt per suite: its action language in prose, its list of actions generated
from the suite's tool schema), ``ACT_TOOL`` (the default tool), ``suite_tools`` with ``SUITE_TOOL_PROMPTS``
(``tools="suite"``: the suite's own tools offered as functions generated from its schema), and ``strip_fences``.
A suite's schema is the one it declares (``Suite.tool_schema``), found through the suite registry
(``envs/suites/registry.py``). Used by ``openai.py``, which re-exports them.
Must never: do I/O.
"""

from __future__ import annotations

import re
from typing import Any

from bunshin.envs.desktop import suite as desktop_suite
from bunshin.envs.suites.errors import UnknownSuite
from bunshin.envs.suites.registry import tool_schema
from bunshin.envs.suites.tools import ToolSchema

from .base import PolicyError

__all__ = ["ACT_TOOL", "ACT_TOOL_NAME", "DEFAULT_PROMPTS", "EXAMPLES", "GENERIC_PROMPT", "SUITE_TOOL_PROMPTS",
           "TEXT_SUFFIX", "TOOL_SUFFIX", "strip_fences", "suite_tools"]

ACT_TOOL_NAME = "act"

ACT_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": ACT_TOOL_NAME,
        "description": "Take the next action in the environment.",
        "parameters": {
            "type": "object",
            "properties": {
                "action": {
                    "type": "string",
                    "description": "The next action, written exactly in the task's action language "
                                   "(see the system prompt).",
                },
            },
            "required": ["action"],
        },
    },
}

_WEBSHOP_INTRO = """\
You are an autonomous agent operating a web browser on an online shop. Each observation is the accessibility \
tree of the current page: every element you can act on is shown with its numeric id in square brackets, like \
[12] button 'Add to Cart'."""

# The action language (how an action is written) is prose; the list of actions is generated from the suite's schema.
_WEBSHOP_LANGUAGE = """\
Actions (one per turn) are written as the action's name followed by its arguments, each in square brackets, in \
the order listed below: click [id] clicks the element with this id; type [id] [text] [1] types text into a field \
and then presses Enter (a true/false argument is written 1 or 0: [0] types without pressing Enter); stop [answer] \
finishes the task. An argument with a default may be left out at the end (stop alone is stop []). Use only ids \
that appear in the current observation; stop [N/A] if the task cannot be done.

The actions, with their arguments:
{listing}"""

_DESKTOP_INTRO = """\
You are an autonomous agent operating a Linux desktop with a terminal, a text editor and a spreadsheet. Each \
observation describes the open windows and the output of your last action. The user's home is /home/user."""

_DESKTOP_LANGUAGE = """\
Actions (one per turn, written exactly like this):
  terminal: <shell command>       run a command in the terminal, like terminal: ls -la ~/Documents
  <tool>: <text>                  the same short form for the one text argument of {compact}
  {{"name": "<tool>", "args": {{...}}}}  any tool below as JSON, with its arguments by name
  WAIT                            wait a moment (WAIT: <seconds> for longer)
  DONE                            the task is complete
  FAIL                            the task cannot be done

The tools, with their arguments (an argument with a default may be left out):
{listing}"""

GENERIC_PROMPT = """\
You are an autonomous agent completing a task in an environment. Each observation shows the environment's \
current state. Reply with one action per turn in the environment's action language."""

def _schema(suite: str) -> ToolSchema:
    """The tool schema suite ``suite`` declares; ``PolicyError`` for an unknown suite or one without a schema."""
    try:
        schema = tool_schema(suite)
    except UnknownSuite as exc:
        raise PolicyError(f"no tool schema for suite {suite!r}: {exc}") from exc
    if schema is None:
        raise PolicyError(f"no tool schema for suite {suite!r}: it declares none")
    return schema


DEFAULT_PROMPTS: dict[str, str] = {
    "webshop": f"{_WEBSHOP_INTRO}\n\n" + _WEBSHOP_LANGUAGE.format(listing=_schema("webshop").listing()),
    "desktop": f"{_DESKTOP_INTRO}\n\n" + _DESKTOP_LANGUAGE.format(
        compact=", ".join(name for name in desktop_suite.COMPACT if name != "terminal"),
        listing=_schema("desktop").listing()),
}

# With the suite's own tools offered (``tools="suite"``) the functions' definitions describe them: no list here.
SUITE_TOOL_PROMPTS: dict[str, str] = {
    "webshop": f"{_WEBSHOP_INTRO}\n\nAct by calling exactly one of the tools per turn. Use only element ids that "
               "appear in the current observation. Call stop with the answer to finish (answer N/A if the task "
               "cannot be done).",
    "desktop": f"{_DESKTOP_INTRO}\n\nAct by calling exactly one of the tools per turn. Call DONE when the task is "
               "complete, FAIL if it cannot be done.",
}


def suite_tools(suite: str) -> list[dict[str, Any]]:
    """The suite's agent tools as OpenAI function definitions, generated from its tool schema (a model's call of
    one is a ``ToolCall`` the suite's application decodes through the same schema); ``PolicyError`` for a suite
    the registry does not have or one without a schema."""
    return _schema(suite).openai_tools()


TOOL_SUFFIX = ("\n\nGive each action by calling the `act` tool with the action text as its `action` argument "
                "(exactly one call per turn).")
TEXT_SUFFIX = "\n\nReply with the action only, inside a ``` code block, like:\n```\n{example}\n```"
EXAMPLES = {"webshop": "click [12]", "desktop": "terminal: ls"}

_FENCE = re.compile(r"```([^\n`]*\n)?(.*?)```", re.S)
_THINK = re.compile(r"<think>.*?(</think>|$)", re.S)
def strip_fences(text: str) -> str:
    """The action in a model's text: ``<think>`` blocks dropped; the last fenced block's body if there is one
    (a language tag such as ```json on its own first line is dropped; an unclosed last fence counts to the end),
    else the text; whitespace stripped."""
    text = _THINK.sub("", text)
    blocks = _FENCE.findall(text)
    if blocks:
        tag, body = blocks[-1]
    elif "```" in text:  # an unclosed fence (the reply ran out of tokens): what follows it
        tag, newline, body = text.rsplit("```", 1)[1].partition("\n")
        tag, body = (tag + newline, body) if newline else ("", tag)
    else:
        return text.strip()
    if tag and not body.strip():  # ```DONE\n```: the "tag" line is the action itself
        body = tag
    elif tag and not re.fullmatch(r"[\w+.-]*\s*", tag):
        body = tag + body  # ```click [3]\n...```: not a language tag
    return body.strip()



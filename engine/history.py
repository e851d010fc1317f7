"""What the engine has seen agents do, as turns: the prefix tree's history, which the Spec Tool Selector learns.

Owns: ``Turn``, one call of the history: the task, the calls before it, the observation they led to, the call, and
how often it was used. The prefix cache produces turns (``PrefixCache.history``), the speculator consumes them; this
module lets each depend on the record instead of on the other.
Must never: do I/O or import the prefix cache or speculation.
"""

from __future__ import annotations

from dataclasses import dataclass

from bunshin.envs.records import Observation, ToolCall
from bunshin.envs.suites.base import SuiteTask


@dataclass(frozen=True)
class Turn:
    """``calls`` led to ``observation``, then ``call`` was issued; ``uses``: its node's hits plus the execution
    that made it."""

    task: SuiteTask
    calls: tuple[ToolCall, ...]
    observation: Observation
    call: ToolCall
    uses: int

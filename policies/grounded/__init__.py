"""The grounded policy: decides from the instruction and what it observes, never from the task's reference."""

from .policy import GroundedPolicy

__all__ = ["GroundedPolicy"]

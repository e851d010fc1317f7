"""Which policy a command line names: ``scripted``, ``grounded``, ``replay:PATH``, ``openai:URL``.

Owns: the spec -> policy table; policies are imported lazily (a scripted run never imports the HTTP client).
"""

from __future__ import annotations

from .base import Policy


def make_policy(spec: str, time_scale: float) -> Policy:
    if spec == "scripted":
        from .scripted import ScriptedPolicy

        return ScriptedPolicy(time_scale=time_scale)
    if spec == "grounded":
        from .grounded import GroundedPolicy

        return GroundedPolicy(time_scale=time_scale)
    if spec.startswith("replay:"):
        from .replay import ReplayPolicy

        return ReplayPolicy.from_file(spec.removeprefix("replay:"))
    if spec.startswith("openai:"):
        from .openai import OpenAIPolicy

        return OpenAIPolicy(spec.removeprefix("openai:"))
    raise ValueError(f"unknown policy {spec!r}: use scripted, grounded, replay:PATH or openai:URL")

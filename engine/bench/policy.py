"""The policies the benchmarks drive: ``grounded`` or ``scripted``, at a reasoning time scale, with a detour rate.

Owns: ``POLICIES`` and ``bench_policy``, the one builder ``bench epoch``, ``bench selector`` and ``bench sharing``
use; a name or a rate it refuses is a ``BadRequest`` naming it.
Must never: build a policy that needs a server or a recording (those are ``bunshin eval``'s ``--policy``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bunshin.policies.base import Policy

if TYPE_CHECKING:
    from bunshin.policies.grounded import GroundedPolicy
    from bunshin.policies.scripted import ScriptedPolicy

from ..errors import BadRequest

POLICIES = ("grounded", "scripted")


def bench_policy(name: str, time_scale: float, detour_p: float | None = None) -> Policy:
    """The policy ``name`` at ``time_scale``; ``detour_p`` (None: the policy's own) its detour probability."""
    if name not in POLICIES:
        raise BadRequest(f"unknown policy {name!r}: use {' or '.join(POLICIES)}")
    kind: type[GroundedPolicy] | type[ScriptedPolicy]
    if name == "grounded":
        from bunshin.policies.grounded import GroundedPolicy as kind
    else:
        from bunshin.policies.scripted import ScriptedPolicy as kind
    if detour_p is None:
        return kind(time_scale=time_scale)
    try:
        return kind(detour_p=detour_p, time_scale=time_scale)
    except ValueError as exc:
        raise BadRequest(f"--detour-p: {exc}") from exc

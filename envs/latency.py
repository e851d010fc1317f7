"""Tool latency that belongs to the environment: how long a suite's agent tools take in the systems they stand for
(a WebArena page load, OSWorld's pause after an action), drawn per call and slept inside the workspace's host, where
the host's ``execute`` measures it into the observation's ``tool_seconds``.

Owns: ``Delay`` (one kind of call's latency: a fixed part plus a lognormal), the suites' default profiles
(``WEBSHOP``, ``DESKTOP``; their sources are in docs/suites.md, "Tool latency"), ``check_time_scale`` (the suites'
``time_scale`` knob) and ``ToolLatency``, a workspace's latency state: the profile, the scale, and a running hash
chain of the canonical agent calls executed in this workspace's lineage. A call's delay is
``fixed + median * exp(sigma * z)`` times ``time_scale``, with ``z`` a standard normal drawn from the chain after
the call is appended: a function of (profile, canonical call, every agent call before it), so replaying the calls
from the same state gives the same delays, a live fork inherits the chain with the process's memory, and a state
image (``checkpoint``/``restore``) carries it as plain data.
Must never: read the workspace's seed or random streams (forks are reseeded per sample; two samples issuing the same
calls from the same state see the same delays), the wall clock, or an internal tool (names starting with ``_``: they
neither wait nor enter the chain, so setup, resolution and scoring leave agent delays unchanged).
"""

from __future__ import annotations

import hashlib
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any

from .records import ToolCall, canonical

Z_BOUND = 4.0  # draws are clamped to +-4 sigma: one call in ~16,000 is cut, and no call waits without bound
_NORMAL = statistics.NormalDist()


@dataclass(frozen=True)
class Delay:
    """A kind of call's latency at ``time_scale`` 1: ``fixed_s`` plus a lognormal of median ``median_s`` and log
    standard deviation ``sigma`` (``median_s`` 0: no random part)."""

    fixed_s: float = 0.0
    median_s: float = 0.0
    sigma: float = 0.0

    def seconds(self, z: float) -> float:
        return self.fixed_s + (self.median_s * math.exp(self.sigma * z) if self.median_s else 0.0)


NONE = Delay()

# The web shop: WebArena's harness sleeps a fixed 2 s after every action before it observes (``run.py`` forces
# ``sleep_after_execution = 2.0``), on top of the page's own time: the load of a page from the shop's server (a
# click on a link or a submit, goto, Enter in a search box), or a browser round trip for an action that stayed on the
# page (typing, hover, scroll, tab switches, back/forward served from the browser's cache). docs/suites.md gives the
# sources.
WEBSHOP: dict[str, Delay] = {"page": Delay(fixed_s=2.0, median_s=1.0, sigma=0.5),
                             "in_page": Delay(fixed_s=2.0, median_s=0.15, sigma=0.5)}

# The desktop: OSWorld's runners sleep a fixed pause after every action before the screenshot, and the action itself
# is a round trip to the VM's controller; a terminal command is real and keeps its real time, and WAIT already
# sleeps the seconds it asks for.
DESKTOP: dict[str, Delay] = {"action": Delay(fixed_s=0.5, median_s=0.3, sigma=0.5), "command": NONE, "wait": NONE}

PROFILES = {"webshop": WEBSHOP, "desktop": DESKTOP}


def check_time_scale(time_scale: Any) -> float:
    """``time_scale`` as a float; ``ValueError`` naming the knob unless it is a finite number >= 0."""
    if isinstance(time_scale, bool) or not isinstance(time_scale, int | float) or not 0 <= time_scale < math.inf:
        raise ValueError(f"time_scale must be a finite number >= 0 (0 turns tool latency off), got {time_scale!r}")
    return float(time_scale)


def _digest(*parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.digest()


class ToolLatency:
    """A workspace's tool latency: ``begin(name, args)`` when an agent call starts (it enters the chain and gets its
    draw), ``wait(draw, kind)`` where the real system would wait (the call's delay is slept and kept as ``last_s``).
    Plain data: it forks with the host's memory and pickles into the app's state image."""

    def __init__(self, profile: str, time_scale: float = 1.0):
        if profile not in PROFILES:
            raise ValueError(f"unknown latency profile {profile!r}; known: {', '.join(sorted(PROFILES))}")
        self.profile = profile
        self.time_scale = check_time_scale(time_scale)
        self.chain = _digest(b"bunshin.tool-latency", profile.encode())
        self.calls = 0
        self.last_s = 0.0

    def begin(self, name: str, args: dict[str, Any]) -> float:
        """An agent call starts: it joins the chain; its standard normal draw (clamped to +-``Z_BOUND``)."""
        if name.startswith("_"):
            raise ValueError(f"internal tool {name!r} has no latency")
        self.chain = _digest(self.chain, canonical(ToolCall(name=name, args=args)))
        self.calls += 1
        self.last_s = 0.0
        k = int.from_bytes(_digest(self.chain, b"draw")[:8], "little") >> 11  # 53 bits
        return max(-Z_BOUND, min(Z_BOUND, _NORMAL.inv_cdf((k + 0.5) / (1 << 53))))

    def delay(self, draw: float, kind: str) -> float:
        """Seconds a call of ``kind`` with this draw waits, scaled."""
        return PROFILES[self.profile][kind].seconds(draw) * self.time_scale

    def wait(self, draw: float, kind: str) -> float:
        """Sleep the call's delay (in the host: it is part of the call's ``tool_seconds``); returns it."""
        self.last_s = self.delay(draw, kind)
        if self.last_s > 0:
            time.sleep(self.last_s)
        return self.last_s

    def state(self) -> dict[str, Any]:
        """What the internal ``_latency`` tool shows: the last agent call's delay, the calls in the chain, its hash."""
        return {"last_s": self.last_s, "calls": self.calls, "chain": self.chain.hex(), "profile": self.profile,
                "time_scale": self.time_scale}

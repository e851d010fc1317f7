"""The tree fork's errors: a refusal (the source holds something it cannot reproduce) and a failed build.

Owns: ``TreeForkRefused`` and ``TreeForkFailed``, both ``ForkFailed``s (the source is unchanged and keeps running).
"""

from __future__ import annotations

import os

from ...errors import ForkFailed


class TreeForkRefused(ForkFailed):
    """The source holds something a tree fork cannot reproduce faithfully; ``culprit`` names it (the process, the
    descriptor or mapping, what it is). Nothing was built."""

    def __init__(self, culprit: str, why: str):
        super().__init__(None, f"tree fork refused: {culprit}: {why}")
        self.culprit = culprit
        self.why = why

    @property
    def transient(self) -> bool:
        """A state a running source leaves by itself (bytes or descriptors in flight, events or messages queued, a
        connection its listener has not accepted yet, one its peer has closed): a fork tried again a moment later
        may be taken."""
        return any(words in self.why for words in TRANSIENT)


# what a refusal of a transient state says (``reader.py``'s refusals)
TRANSIENT = ("in flight", "queued", "not yet accepted", "closed by its peer")


class TreeForkFailed(ForkFailed):
    """The builder failed; ``pid`` is the clone process it failed in (0: the builder itself), ``errno`` why."""

    def __init__(self, pid: int, errno: int, what: str):
        where = f"clone pid {pid}" if pid else "the builder"
        super().__init__(None, f"tree fork failed in {where}: {what}: {os.strerror(errno) if errno else 'error'}")
        self.pid, self.errno, self.what = pid, errno, what

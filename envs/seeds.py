"""Seeds: every random choice takes a seed derived from its context (docs/design.md section 4).

Owns: ``derive_seed``, stable across processes and Python versions (no ``hash()``).
"""

from __future__ import annotations

import hashlib


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any parts (run seed, task id, sample index, step...)."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1

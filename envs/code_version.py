"""The version of the environment's code, as a digest: what a cached workspace state or a learned model is only
valid for.

Owns: ``code_version()``, a digest of every source and task file of ``bunshin.envs``: a new version of a tool may
answer differently, so the prefix tree starts new namespaces and the Spec Tool Selector a new model.
Must never: depend on anything but those files' names and bytes (not their times, not the machine).
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path


@functools.cache
def code_version() -> str:
    """16 hex digits of sha256 over every ``.py`` and ``.json`` file under ``bunshin.envs``, by relative path."""
    root = Path(__file__).parent
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in {".py", ".json"} and p.is_file()):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]

"""What a run asks of the prefix cache: ``PrefixSettings`` (``bunshin eval --prefix-cache`` and its flags).

Owns: the settings and their validation. The cache itself is ``cache.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

STRATEGIES = ("lru", "cost")


@dataclass(frozen=True, kw_only=True)
class PrefixSettings:
    """``cache_dir``: where the tree and its cold checkpoints live across runs (None: memory only, hot entries
    only); ``hot_budget`` / ``disk_budget``: bytes of frozen snapshots in memory (their private memory) / of
    checkpoints on disk (None: unbounded; defaults 256 MiB, about a dozen web-shop snapshots of ~20 MiB private
    each, so that memory stays bounded however long a run is, and 8 GiB); ``hot_share``: a relative hot budget, the
    share of the most the run has held without its hot entries (0.1: the snapshots may lift the run's peak by about
    a tenth), applied with ``hot_budget`` when both are set (None: none); ``strategy``: ``lru`` (default) or ``cost`` (cost-aware, GreedyDual-Size-Frequency);
    ``min_issuers``: distinct issuers of a call from one node before it becomes a node (admission);
    ``writers`` / ``backlog``: background checkpoint writers and their queue's bound."""

    cache_dir: Path | None = None
    hot_budget: int | None = 256 << 20
    disk_budget: int | None = 8 << 30
    hot_share: float | None = None
    strategy: str = "lru"
    min_issuers: int = 2
    writers: int = 1  # one image in the pool's tmpfs at a time: a web-shop state is ~130 MiB
    backlog: int = 16

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"prefix cache strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        for name in ("hot_budget", "disk_budget"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0 bytes, got {value}")
        if self.hot_share is not None and not 0.0 <= self.hot_share <= 10.0:
            raise ValueError(f"hot_share must be a fraction in [0, 10], got {self.hot_share}")
        if self.writers < 1 or self.backlog < 1:
            raise ValueError(f"writers and backlog must be >= 1, got {self.writers}, {self.backlog}")
        if self.cache_dir is not None:
            object.__setattr__(self, "cache_dir", Path(self.cache_dir))

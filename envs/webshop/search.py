"""Ranked full-text search over the catalog: BM25 over name, brand, category and description.

Owns: tokenising, the inverted index, and ranking. The index is numeric arrays in one huge-page heap (terms as
sorted 64-bit hashes, postings in CSR form, document lengths), so a fork's searches read it without copying it.
Must never: keep per-term Python objects (their reference counts would be written on every search).
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from typing import Any

import numpy as np

from ..app import HugeHeap
from .catalog import Catalog

_WORD = re.compile(r"[a-z0-9]+")
K1, B = 1.2, 0.75


def tokenize(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def term_hash(term: str) -> int:
    return int.from_bytes(hashlib.blake2b(term.encode(), digest_size=8).digest(), "little") >> 1


class SearchIndex:
    def __init__(self, catalog: Catalog):
        postings: dict[int, list[tuple[int, int]]] = {}
        lengths = np.zeros(len(catalog), dtype=np.float32)
        for doc in range(len(catalog)):
            p = catalog[doc]
            words = tokenize(f"{p.name} {p.brand} {p.category.replace('/', ' ')} {p.description}")
            lengths[doc] = len(words)
            for term, tf in Counter(words).items():
                postings.setdefault(term_hash(term), []).append((doc, tf))
        hashes = np.array(sorted(postings), dtype=np.int64)
        counts = np.array([len(postings[h]) for h in hashes.tolist()], dtype=np.int64)
        offsets = np.zeros(len(hashes) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        n = int(offsets[-1])
        sizes = [hashes.nbytes, offsets.nbytes, n * 4, n * 4, lengths.nbytes]
        self.heap = HugeHeap(sum(sizes))
        self._views(sizes)
        self.hashes[:], self.offsets[:], self.lengths[:] = hashes, offsets, lengths
        flat = [pair for h in hashes.tolist() for pair in postings[h]]
        self.docs[:] = [d for d, _ in flat]
        self.tfs[:] = [tf for _, tf in flat]
        self.n_docs = len(catalog)
        self.avg_len = float(lengths.mean()) if len(catalog) else 0.0

    def _views(self, sizes: list[int]) -> None:
        self._sizes = sizes
        arrays, at = [], 0
        for size, dtype in zip(sizes, (np.int64, np.int64, np.int32, np.float32, np.float32), strict=True):
            arrays.append(np.frombuffer(self.heap.map, dtype=dtype, count=size // np.dtype(dtype).itemsize,
                                        offset=at))
            at += size
        self.hashes, self.offsets, self.docs, self.tfs, self.lengths = arrays

    def __getstate__(self) -> dict[str, Any]:
        """For a state image: the heap (its bytes out of band) and the layout of the arrays in it."""
        return {"heap": self.heap, "sizes": self._sizes, "n_docs": self.n_docs, "avg_len": self.avg_len}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.heap, self.n_docs, self.avg_len = state["heap"], state["n_docs"], state["avg_len"]
        self._views(state["sizes"])

    def search(self, query: str, limit: int = 20) -> list[tuple[int, float]]:
        """(document, score) pairs, best first; ties broken by document number so results are deterministic."""
        scores = np.zeros(self.n_docs, dtype=np.float64)
        for term in set(tokenize(query)):
            h = term_hash(term)
            i = int(np.searchsorted(self.hashes, h))
            if i >= len(self.hashes) or int(self.hashes[i]) != h:
                continue
            lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
            docs, tfs = self.docs[lo:hi], self.tfs[lo:hi]
            idf = np.log(1 + (self.n_docs - (hi - lo) + 0.5) / ((hi - lo) + 0.5))
            norm = K1 * (1 - B + B * self.lengths[docs] / self.avg_len)
            scores[docs] += idf * tfs * (K1 + 1) / (tfs + norm)
        hits = np.flatnonzero(scores)
        order = np.lexsort((hits, -scores[hits]))[:limit]
        return [(int(hits[j]), float(scores[hits[j]])) for j in order]

    def close(self) -> None:
        del self.hashes, self.offsets, self.docs, self.tfs, self.lengths
        self.heap.close()

"""The shop's catalog and search: deterministic, ranked, and packed so that a fork reading it keeps sharing it."""

from __future__ import annotations

import pytest

from bunshin.envs.webshop.catalog import Catalog, generate_products
from bunshin.envs.webshop.search import SearchIndex


def test_catalog_is_deterministic_and_complete() -> None:
    a, b = generate_products(300, seed=7), generate_products(300, seed=7)
    assert a == b
    assert generate_products(300, seed=8) != a
    cats = {p.category for p in a}
    assert len(cats) == 40  # every subcategory has products
    assert all(p.price_cents > 0 and p.name and p.description for p in a)
    assert any(p.reviews for p in a) and any(not p.reviews for p in a)


def test_packed_catalog_decodes_the_same_products() -> None:
    catalog = Catalog(200, seed=3)
    try:
        assert [catalog[i] for i in range(len(catalog))] == generate_products(200, seed=3)
        with pytest.raises(IndexError):
            catalog[200]
    finally:
        catalog.close()


def test_search_ranks_matching_products_first() -> None:
    catalog = Catalog(2000, seed=1)
    index = SearchIndex(catalog)
    try:
        hits = index.search("wireless noise-cancelling headphones", limit=10)
        assert hits and all(s1 >= s2 for (_, s1), (_, s2) in zip(hits, hits[1:]))
        for doc, _ in hits[:2]:  # products with two adjectives can't exist: the best match two query words
            text = f"{catalog[doc].name} {catalog[doc].category}".lower()
            assert "headphones" in text and "noise-cancelling" in text
        assert index.search("zzzz-no-such-word") == []
        assert index.search("wireless noise-cancelling headphones", limit=10) == hits  # deterministic
    finally:
        index.close()
        catalog.close()


@pytest.mark.asyncio
async def test_a_forked_shop_reads_its_catalog_without_copying_it(runtime) -> None:
    from bunshin.envs import AppSpec, ToolCall

    shop = await runtime.create(AppSpec(target="bunshin.envs.webshop.app:ShopApp",
                                        kwargs={"catalog_size": 20_000}))
    clone = await shop.fork()
    right_after = clone.memory().private
    for q in ["coffee maker", "wireless headphones", "yoga mat", "dark chocolate", "rain jacket"] * 10:
        obs = await clone.execute(ToolCall(name="search", args={"q": q}))
        assert obs.error is None and obs.data["results"]
    for doc in range(0, 20_000, 97):
        await clone.execute(ToolCall(name="product", args={"id": doc}))
    grown = clone.memory().private - right_after
    # 50 searches over the whole index and ~200 product reads: the 16 MiB of packed state stays shared
    assert grown < 4 << 20, f"the clone copied {grown / 2**20:.1f} MiB while only reading"

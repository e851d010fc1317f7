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
async def test_the_shop_serves_search_category_and_product_pages(runtime) -> None:
    import re

    from bunshin.envs import AppSpec, ToolCall

    shop = await runtime.create(AppSpec(target="bunshin.envs.webshop.app:ShopApp", kwargs={"catalog_size": 2000}))

    async def get(path: str):
        obs = await shop.execute(ToolCall(name="http_get", args={"path": path}))
        assert obs.error is None, obs
        return obs.data["status"], obs.output

    status, home = await get("/")
    assert status == 200 and "Headphones" in home
    status, results = await get("/catalogsearch/result/?q=noise-cancelling+headphones")
    links = re.findall(r'class="product-item-link" href="([^"]+)">([^<]+)<', results)
    assert status == 200 and links and "Headphones" in links[0][1]
    status, page = await get(links[0][0])
    assert status == 200 and f'<span class="base">{links[0][1]}</span>' in page and 'class="price"' in page
    category = re.search(r'href="(/electronics/headphones\.html)"', home).group(1)
    status, listing = await get(category)
    assert status == 200 and listing.count('class="product-item-link"') == 12
    assert (await get("/no-such-thing-b0009999999.html"))[0] == 404
    assert (await get("/catalogsearch/result/?q=zzzz"))[1].count("returned no results") == 1
    # agents reach the shop over the workspace's loopback too
    fetch = "python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:7770/').status)\""
    assert (await shop.execute(ToolCall(name="shell", args={"cmd": fetch}))).output == "200\n"


@pytest.mark.asyncio
async def test_a_forked_shop_reads_its_catalog_without_copying_it(runtime) -> None:
    import re

    from bunshin.envs import AppSpec, ToolCall

    shop = await runtime.create(AppSpec(target="bunshin.envs.webshop.app:ShopApp",
                                        kwargs={"catalog_size": 40_000}))
    clone = await shop.fork()
    right_after = clone.memory().private
    pages = []
    for q in ["coffee maker", "wireless headphones", "yoga mat", "dark chocolate", "rain jacket"] * 10:
        obs = await clone.execute(ToolCall(name="http_get", args={"path": f"/catalogsearch/result/?q={q.replace(' ', '+')}"}))
        assert obs.data["status"] == 200
        pages += re.findall(r'class="product-item-link" href="([^"]+)"', obs.output)
    for path in sorted(set(pages))[:100]:
        assert (await clone.execute(ToolCall(name="http_get", args={"path": path}))).data["status"] == 200
    grown = clone.memory().private - right_after
    # 50 searches over the whole index and 100 product pages read all of the ~32 MiB of packed catalog and
    # index; what the clone owns afterwards is allocator churn of its two processes (~6 MiB), not a copy
    assert grown < 16 << 20, f"the clone copied {grown / 2**20:.1f} MiB while only reading"


@pytest.mark.asyncio
async def test_carts_live_in_each_forks_own_database(runtime) -> None:
    import re

    from bunshin.envs import AppSpec, ToolCall

    shop = await runtime.create(AppSpec(target="bunshin.envs.webshop.app:ShopApp", kwargs={"catalog_size": 500}))

    async def add(ws, doc: int) -> None:
        sku = f"B000{doc:07d}"
        obs = await ws.execute(ToolCall(name="http_post", args={"path": "/checkout/cart/add/",
                                                                "form": {"sku": sku, "qty": 1}}))
        assert obs.data == {"status": 302, "location": "/checkout/cart/"}, obs

    async def cart(ws) -> list[str]:
        page = (await ws.execute(ToolCall(name="http_get", args={"path": "/checkout/cart/"}))).output
        return re.findall(r'class="product-item-link" href="[^"]+-(b\d+)\.html"', page)

    assert await cart(shop) == []
    await add(shop, 1)
    clone = await shop.fork()
    await add(clone, 2)
    await add(shop, 3)
    assert await cart(shop) == ["b0000000001", "b0000000003"]
    assert await cart(clone) == ["b0000000001", "b0000000002"]
    snap = await clone.snapshot()
    one, two = await snap.fork(), await snap.fork()
    await add(one, 4)
    assert await cart(one) == ["b0000000001", "b0000000002", "b0000000004"]
    assert await cart(two) == ["b0000000001", "b0000000002"]
    bad = await shop.execute(ToolCall(name="http_post", args={"path": "/checkout/cart/add/",
                                                              "form": {"sku": "nope", "qty": 1}}))
    assert bad.data["status"] == 400 and await cart(shop) == ["b0000000001", "b0000000003"]

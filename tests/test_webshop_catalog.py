"""The shop's catalog and search: deterministic, ranked, and packed so that a fork reading it keeps sharing it."""

from __future__ import annotations

from itertools import pairwise

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
        assert hits and all(s1 >= s2 for (_, s1), (_, s2) in pairwise(hits))
        for doc, _ in hits[:2]:  # products with two adjectives can't exist: the best match two query words
            text = f"{catalog[doc].name} {catalog[doc].category}".lower()
            assert "headphones" in text and "noise-cancelling" in text
        assert index.search("zzzz-no-such-word") == []
        assert index.search("wireless noise-cancelling headphones", limit=10) == hits  # deterministic
    finally:
        index.close()
        catalog.close()


# Agents reach the shop over the workspace's loopback, as any program in the workspace would: these tests drive it
# with a small urllib client run as the agent, keeping its session cookie in a file between calls.
AGENT_HTTP = r"""
import http.cookiejar, json, re, sys, urllib.parse, urllib.request
jar = http.cookiejar.MozillaCookieJar("/home/agent/cookies.txt")
try:
    jar.load(ignore_discard=True)
except OSError:
    pass
class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *a, **k):
        return None
opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar), NoRedirect)
out = []
for method, path, form in json.loads(sys.argv[1]):
    data = urllib.parse.urlencode(form).encode() if method == "POST" else None
    try:
        r = opener.open(urllib.request.Request("http://127.0.0.1:7770" + path, data=data, method=method))
    except urllib.error.HTTPError as e:
        r = e
    body = r.read().decode()
    if sys.argv[2] == "links":  # only the product links: a long run of pages would overflow the output bound
        body = " ".join(re.findall(r'class="product-item-link" href="([^"]+)"', body))
    out.append([r.status, r.headers.get("Location"), body])
jar.save(ignore_discard=True)
print(json.dumps(out))
"""


async def agent_http(ws, *requests, links_only: bool = False):
    """[(status, location, body)] of requests ``("GET", path, {})`` / ``("POST", path, form)`` made by the agent."""
    import json
    import shlex

    from bunshin.envs import ToolCall

    mode = "links" if links_only else "bodies"
    cmd = f"python3 -c {shlex.quote(AGENT_HTTP)} {shlex.quote(json.dumps(requests))} {mode}"
    obs = await ws.execute(ToolCall(name="shell", args={"cmd": cmd}))
    assert obs.exit_code == 0, obs
    return json.loads(obs.output)


@pytest.mark.asyncio
async def test_the_shop_serves_search_category_and_product_pages(runtime) -> None:
    import re

    from bunshin.envs import AppSpec

    shop = await runtime.create(AppSpec(target="bunshin.envs.webshop.app:ShopApp", kwargs={"catalog_size": 2000}))

    async def get(path: str):
        (status, _, body), = await agent_http(shop, ("GET", path, {}))
        return status, body

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
    cheap = re.findall(r'<span class="price">\$([\d,.]+)</span>', (await get(
        category + "?product_list_order=price&product_list_dir=asc"))[1])
    prices = [float(p.replace(",", "")) for p in cheap]
    assert len(prices) == 12 and prices == sorted(prices)
    assert (await get("/no-such-thing-b0009999999.html"))[0] == 404
    assert (await get("/catalogsearch/result/?q=zzzz"))[1].count("returned no results") == 1


@pytest.mark.asyncio
async def test_a_forked_shop_reads_its_catalog_without_copying_it(runtime) -> None:
    from bunshin.envs import AppSpec

    shop = await runtime.create(AppSpec(target="bunshin.envs.webshop.app:ShopApp",
                                        kwargs={"catalog_size": 40_000}))
    clone = await shop.fork()
    right_after = clone.memory().private
    queries = ["coffee maker", "wireless headphones", "yoga mat", "dark chocolate", "rain jacket"] * 10
    answers = await agent_http(clone, *(("GET", f"/catalogsearch/result/?q={q.replace(' ', '+')}", {})
                                       for q in queries), links_only=True)
    assert all(status == 200 for status, _, _ in answers)
    paths = sorted({p for _, _, links in answers for p in links.split()})[:100]
    assert len(paths) >= 50
    read = await agent_http(clone, *(("GET", p, {}) for p in paths), links_only=True)
    assert all(status == 200 for status, _, _ in read)
    grown = clone.memory().private - right_after
    # 50 searches over the whole index and 100 product pages read the packed catalog, index and images; what
    # the clone owns afterwards is allocator churn of its two processes, not a copy
    assert grown < 16 << 20, f"the clone copied {grown / 2**20:.1f} MiB while only reading"


@pytest.mark.asyncio
async def test_carts_live_in_each_forks_own_database(runtime) -> None:
    import re

    from bunshin.envs import AppSpec

    shop = await runtime.create(AppSpec(target="bunshin.envs.webshop.app:ShopApp", kwargs={"catalog_size": 500}))

    async def add(ws, doc: int) -> None:
        (status, location, _), = await agent_http(ws, ("POST", "/checkout/cart/add/",
                                                       {"sku": f"B000{doc:07d}", "qty": 1}))
        assert (status, location) == (302, "/checkout/cart/")

    async def cart(ws) -> list[str]:
        (_, _, page), = await agent_http(ws, ("GET", "/checkout/cart/", {}))
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
    (status, _, _), = await agent_http(shop, ("POST", "/checkout/cart/add/", {"sku": "nope", "qty": 1}))
    assert status == 400 and await cart(shop) == ["b0000000001", "b0000000003"]

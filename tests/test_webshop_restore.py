"""The web shop on the private-restore backend (the CRIU-like baseline): a shop forked mid-checkout is restored
into a fresh workspace that goes on exactly where its source was (same page, history, typed values, cookies,
shop state) and holds all of it in its own private memory, while a live fork shares most of it."""

from __future__ import annotations

import asyncio
import json
import pickle
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from bunshin.envs import ToolCall, WorkspaceRuntime
from bunshin.envs.runtime.page_sharing import compare, page_set
from bunshin.envs.suites.base import play
from bunshin.envs.webshop import tasks as generator
from bunshin.envs.webshop.browser.browser import Browser
from bunshin.envs.webshop.suite import WebShopSuite

from .shop_server import ShopSite, do, find_id, product_url, serve_shop

CATALOG = 2000
OBSERVE = ToolCall(name="observe", args={})
# An agent's own request without the browser's cookie: the shop starts a session from its seeded stream.
NEW_SESSION = ToolCall(name="shell", args={"cmd": (
    "python3 -c \"import urllib.request as u; "
    "print(u.urlopen('http://127.0.0.1:7770/').headers['Set-Cookie'])\"")})


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("webshop-restore-tasks")
    generator.write(directory, generator.generate(CATALOG, 0))
    return directory


def checkout_tasks(suite: WebShopSuite):
    found = [t for t in suite.tasks() if t.template == "checkout"]
    return found[0], found[1]


async def mid_checkout(rt: WorkspaceRuntime, suite: WebShopSuite, task):
    """A shop on the checkout page: product found, in the cart, three address fields typed, the page scrolled
    (as far as it goes)."""
    ws = await rt.create(suite.app())
    await suite.start(ws, task)
    async for _, obs in play(suite, ws, task, task.reference[:7]):
        assert obs.error is None, obs.error
    assert (await ws.execute(ToolCall(name="scroll", args={"direction": "down"}))).error is None
    return ws


async def forked_mid_checkout(make_runtime, backend: str, tasks_dir: Path):
    """(suite, task, other checkout task, source mid-checkout, its clone, the source's observation before the fork)
    on a runtime of ``backend``."""
    rt: WorkspaceRuntime = await make_runtime(backend=backend)
    suite = WebShopSuite(catalog_size=CATALOG, tasks_dir=tasks_dir, time_scale=0.0)
    task, other = checkout_tasks(suite)
    source = await mid_checkout(rt, suite, task)
    before = await source.execute(OBSERVE)
    return suite, task, other, source, await source.fork(), before


async def sharing(a, b):
    return compare(await asyncio.to_thread(page_set, a.cgroup.procs()),
                   await asyncio.to_thread(page_set, b.cgroup.procs()))


@pytest.mark.asyncio
async def test_a_restored_shop_goes_on_where_its_source_was_in_private_memory(make_runtime, tasks_dir) -> None:
    suite, task, other, source, clone, before = await forked_mid_checkout(make_runtime, "restore", tasks_dir)
    assert clone.last_fork is not None and clone.last_fork.ready_s > 0

    # (a) the same observation: text, URL, tabs, the screenshot pixels (typed values and scroll included)
    mine, theirs = await source.execute(OBSERVE), await clone.execute(OBSERVE)
    assert theirs.error is None and theirs.output == mine.output == before.output
    assert theirs.data == mine.data
    assert "Checkout" in theirs.data["title"]
    first = task.reference[4].args["text"]
    assert f"textbox '{first}'" in theirs.output  # a typed field is named by its value

    # (c) nothing of it is physically shared with the source (a live fork would share most of it)
    shared = await sharing(clone, source)
    assert shared.physically_shared_fraction < 0.05, shared
    assert shared.identical_fraction > 0.15, shared  # same content (heaps, rasters, images), private copies
    assert clone.memory().private > 50 << 20
    for pid in clone.cgroup.procs():  # the server spawned during restore did not inherit the checkpoint's map
        assert "ckpt-" not in Path(f"/proc/{pid}/maps").read_text()

    # (b) the clone finishes the task from where it is; the source goes on to another address, on its own
    async for _, obs in play(suite, clone, task, task.reference[7:]):
        assert obs.error is None, obs.error
    async for _, obs in play(suite, source, other, other.reference[4:]):
        assert obs.error is None, obs.error
    assert await suite.evaluate(clone, task, task.reference[-1]) == 1.0
    assert await suite.evaluate(source, task, task.reference[-1]) == 0.0  # the other address
    assert await suite.evaluate(source, other, other.reference[-1]) == 0.0  # half the fields are the first task's
    history = ToolCall(name="_page_text", args={"url": "/sales/order/history/", "selector": ""})
    in_clone, in_source = (await clone.execute(history)).output, (await source.execute(history)).output
    name = f"{first} {task.reference[5].args['text']}"
    assert name in in_clone and name not in in_source
    assert in_clone.count("View Order 000000013") == in_source.count("View Order 000000013") == 1
    # the restored browser kept its history (bfcache) and the session cookie: back to the checkout form
    back = await clone.execute(ToolCall(name="go_back", args={}))
    assert back.error is None and "Checkout" in back.data["title"]


@pytest.mark.asyncio
async def test_a_live_fork_of_the_same_shop_shares_most_of_it(make_runtime, tasks_dir) -> None:
    _, _, _, source, clone, _ = await forked_mid_checkout(make_runtime, "cow", tasks_dir)
    assert (await clone.execute(OBSERVE)).output == (await source.execute(OBSERVE)).output
    shared = await sharing(clone, source)
    assert shared.physically_shared_fraction > 0.5, shared


@pytest.mark.asyncio
async def test_restore_and_live_fork_draw_the_same_session_ids(make_runtime, tasks_dir) -> None:
    """A clone's random state comes from its own seed on both backends (not from its source's stream): the
    restored server issues the same new session id as a live fork's, for the same clone seed."""
    suite = WebShopSuite(catalog_size=CATALOG, tasks_dir=tasks_dir, time_scale=0.0)
    task, _ = checkout_tasks(suite)
    drawn = {}
    for backend in ("cow", "restore"):
        rt: WorkspaceRuntime = await make_runtime(backend=backend)
        ws = await rt.create(suite.app())
        await suite.start(ws, task)
        assert (await ws.execute(NEW_SESSION)).exit_code == 0
        clones = [await ws.fork(seed=1234), await ws.fork(seed=5678)]
        drawn[backend] = []
        for clone in clones:
            obs = await clone.execute(NEW_SESSION)
            assert obs.exit_code == 0, obs.output
            drawn[backend].append(re.search(r"session=(\w+)", obs.output).group(1))
        await rt.close()  # idempotent: the fixture closes it again and checks for leaks
    assert drawn["cow"] == drawn["restore"]
    assert drawn["cow"][0] != drawn["cow"][1]


@pytest.mark.asyncio
async def test_a_restored_shop_restores_again(make_runtime, tasks_dir) -> None:
    """A restored clone is itself a shop with a worker that checkpoints: fork it again, from a snapshot too."""
    rt: WorkspaceRuntime = await make_runtime(backend="restore")
    suite = WebShopSuite(catalog_size=CATALOG, tasks_dir=tasks_dir, time_scale=0.0)
    task, _ = checkout_tasks(suite)
    ws = await rt.create(suite.app())
    await suite.start(ws, task)
    async for _, obs in play(suite, ws, task, task.reference[:3]):  # in the cart
        assert obs.error is None
    snap = await ws.snapshot()
    await ws.close()
    child = await snap.fork()
    grandchild = await child.fork()
    observed = [(await w.execute(OBSERVE)).output for w in (child, grandchild)]
    assert observed[0] == observed[1] and "Shopping Cart" in observed[0]
    rows = json.loads((await grandchild.execute(ToolCall(name="_shop_json",
                                                         args={"path": "/rest/V1/orders/latest"}))).output)
    assert rows == {"order_id": 12}


@pytest.fixture(scope="module")
def site() -> Iterator[ShopSite]:
    with serve_shop() as served:
        yield served


def test_a_browser_pickles_whole(site: ShopSite) -> None:
    """The browser's part of a shop checkpoint: tabs, bfcache entries with rasters and decoded images, the typed
    and scrolled state, the cookies; the restored browser then goes on by itself."""
    b = Browser(site.url + "/")
    do(b, f"goto [{product_url(3)}]")
    do(b, f"click [{find_id(b.observe().output, 'button', 'Add to Cart')}]")  # sets the session cookie
    do(b, "new_tab")
    do(b, f"goto [{product_url(5)}]")
    do(b, "go_back")
    do(b, "go_forward")
    qty = find_id(b.observe().output, "textbox", "1")  # the Qty field, named by its value
    do(b, f"type [{qty}] [4] [0]")
    do(b, "scroll [down]")
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(b, protocol=5, buffer_callback=buffers.append)
    assert buffers and len(data) < b.raster_bytes() // 4  # the pixels go out of band
    r = pickle.loads(data, buffers=[bytearray(x.raw()) for x in buffers])
    assert r.observe() == b.observe() and r.raster_bytes() == b.raster_bytes() > 0
    assert [len(t.history) for t in r.tabs] == [len(t.history) for t in b.tabs] and r.current == b.current
    for mine, theirs in zip((p for t in b.tabs for p in t.history), (p for t in r.tabs for p in t.history),
                            strict=True):
        assert (mine.url, mine.scroll, mine.focused) == (theirs.url, theirs.scroll, theirs.focused)
        assert np.array_equal(mine.raster, theirs.raster) and theirs.raster is not mine.raster
        assert len(mine.images) == len(theirs.images)
        assert all(np.array_equal(x, y) for x, y in zip(mine.images, theirs.images, strict=True))
    assert [(c.name, c.value, c.path) for c in r.cookies] == [(c.name, c.value, c.path) for c in b.cookies]
    # the tree still points into the restored document: typing reaches the form that is submitted
    assert any(n is r.page.tree.nodes[qty] for n in r.page.document.iter())
    do(r, f"type [{qty}] [2] [0]")
    assert b.page.tree.nodes[qty].value == "4" and r.page.tree.nodes[qty].value == "2"
    do(r, "scroll [up]")
    do(r, f"click [{find_id(r.observe().output, 'button', 'Add to Cart')}]")
    last = site.shop.requests[-1]
    assert (last.method, last.path) == ("GET", "/checkout/cart/")
    session = next(c.value for c in b.cookies if c.name == "session")
    assert last.cookie == f"session={session}"  # the restored jar sent the source's session cookie
    for x in (b, r):
        x.close()

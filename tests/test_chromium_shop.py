"""The web shop through a real Chromium inside real workspaces (``--browser chromium``): Debian's Chromium runs
as the agent's user in a PID and mount namespace of its own inside the workspace, driven over its DevTools pipe
by the workspace host; observations are WebArena's accessibility tree, actions real input events; a fork gives the
clone a Chromium of its own brought to the source's state and checked equal."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest

from bunshin.envs import ToolCall
from bunshin.envs.chromium.browser import BINARY
from bunshin.envs.images.recipes import recipe
from bunshin.envs.images.store import ImageStore
from bunshin.envs.runtime.image import AGENT_UID
from bunshin.envs.webshop.suite import WebShopSuite

from .shop_server import CATALOG_SIZE, PRODUCTS, product_url

pytestmark = pytest.mark.asyncio

# Chromium runs from the workspace image `chromium` (not the host's /usr): CI builds it (scripts/setup.sh
# --all-images); a bare checkout says what is missing
if ImageStore().find(recipe("chromium")) is None:
    pytest.fail(f"the workspace image `chromium` (Debian's Chromium, {BINARY}) is not built: run ./scripts/setup.sh "
                "--all-images", pytrace=False)

SHOP = "http://127.0.0.1:7770"
SEARCH = "Search entire store here..."


def call(name: str, **args: object) -> ToolCall:
    return ToolCall(name=name, args=args)


async def act(ws, name: str, **args: object):
    obs = await ws.execute(call(name, **args))
    assert obs.error is None, obs.error
    return obs


def element(obs, role: str, name: str) -> int:
    """The id of the first line ``[id] role 'name'`` of an observation."""
    for line in obs.output.splitlines():
        text = line.strip()
        if text.startswith("[") and f"] {role} {name!r}" in text:
            return int(text[1:text.index("]")])
    raise AssertionError(f"no {role} {name!r} in:\n{obs.output[:3000]}")


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def chromium_processes(run_id: str | None = None) -> list[tuple[int, int, str]]:
    """(pid, uid, the first word of its command line) of every Chromium process on the machine (of run
    ``run_id``'s cgroups only, when given: other engines on the machine may run Chromium too)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")[0].decode()
            uid = int((entry / "status").read_text().split("\nUid:")[1].split()[0])
            groups = (entry / "cgroup").read_text() if run_id is not None else ""
        except (OSError, IndexError):
            continue
        if cmd.endswith("/chromium") and (run_id is None or f"bunshin-{run_id}" in groups):
            found.append((int(entry.name), uid, cmd))
    return found


async def shop(runtime):
    suite = WebShopSuite(catalog_size=200, time_scale=0.0, browser="chromium")
    ws = await runtime.create(suite.app())
    home = await act(ws, "goto", url=f"{SHOP}/")
    return suite, ws, home


async def test_chromium_observes_the_shop_as_webarena_does(runtime) -> None:
    _, ws, home = await shop(runtime)
    header, _, tree = home.output.partition("\n\n")
    assert header == "Tab 0 (current): Home Page"
    assert tree.startswith("[1] RootWebArea 'Home Page' focused: True")
    assert "\t[" in tree  # children indented by tabs
    assert home.data["url"] == f"{SHOP}/" and home.data["status"] == 200 and home.data["tabs"] == ["Home Page"]
    assert png_size(home.data["screenshot"]) == (1280, 720)
    procs = chromium_processes(runtime.run_id)
    assert procs and all(uid == AGENT_UID for _, uid, _ in procs), procs  # the agent's user, never root
    again = await act(ws, "observe")
    assert again.output == home.output  # ids are stable for a page state
    await ws.close()
    await runtime.close()  # the warm pool's slots (their Chromium) go with the run
    assert not chromium_processes(runtime.run_id)


async def test_real_input_navigates_searches_and_goes_back(runtime) -> None:
    _, ws, home = await shop(runtime)
    search = element(home, "textbox", SEARCH)
    results = await act(ws, "type", element_id=search, text="evergreen", press_enter_after=True)
    assert "/catalogsearch/result/" in results.data["url"] and "q=evergreen" in results.data["url"]
    back = await act(ws, "go_back")
    assert back.data["url"] == f"{SHOP}/"
    forward = await act(ws, "go_forward")
    assert forward.data["url"] == results.data["url"]
    scrolled = await act(ws, "scroll", direction="down")
    assert scrolled.output != forward.output  # another part of the page (a dozen results) is in the viewport
    missing = await ws.execute(call("click", element_id=999_999))
    assert missing.error and "no element [999999]" in missing.error  # an error observation, the workspace goes on
    await act(ws, "observe")
    await ws.close()


async def test_a_fork_brings_the_clone_to_the_source_browser_state(runtime) -> None:
    _, ws, home = await shop(runtime)
    cart = await act(ws, "goto", url=f"{SHOP}/checkout/cart/")
    products = await act(ws, "goto", url=f"{SHOP}/")
    search = element(products, "textbox", SEARCH)
    typed = await act(ws, "type", element_id=search, text="unsubmitted words", press_enter_after=False)
    await act(ws, "new_tab")
    await act(ws, "goto", url=f"{SHOP}/checkout/cart/")
    source = await act(ws, "tab_focus", tab_index=0)
    assert "unsubmitted words" in source.output
    clone = await ws.fork()
    try:
        mine = await act(clone, "observe")
        assert mine.output == source.output and mine.data["url"] == source.data["url"]
        assert mine.data["tabs"] == source.data["tabs"] and len(mine.data["tabs"]) == 2
        back = await act(clone, "go_back")  # the history came along: back leads where the source came from
        assert back.data["url"] == cart.data["url"]
        still = await act(ws, "observe")  # the source's browser is untouched
        assert still.output == source.output
    finally:
        await clone.close()
    assert typed.error is None and home.error is None
    await ws.close()
    await runtime.close()
    assert not chromium_processes(runtime.run_id)



async def test_history_of_a_clone_moves_as_the_sources_back_and_forward(runtime) -> None:
    """Every entry but the shown one is restored as a stand-in that history loads from the server when it comes
    back to it: back and forward in the clone show what they show in the source, from a source that was itself
    in the middle of its history when it forked."""
    _, ws, _ = await shop(runtime)
    for path in ("/checkout/cart/", "/customer/account/", "/sales/order/history/", "/checkout/"):
        await act(ws, "goto", url=f"{SHOP}{path}")
    shown = await act(ws, "go_back")  # the source is at the order history, with the checkout ahead of it
    clone = await ws.fork()
    try:
        assert (await act(clone, "observe")).output == shown.output
        for move in ("go_back", "go_back", "go_forward", "go_forward", "go_forward", "go_back", "go_back",
                     "go_back"):
            theirs, mine = await act(ws, move), await act(clone, move)
            assert (mine.data["url"], mine.output) == (theirs.data["url"], theirs.output), move
    finally:
        await clone.close()
    await ws.close()


async def test_a_clone_screenshot_is_the_sources_pixel_for_pixel(runtime) -> None:
    """What the agent sees of a clone is what it would have seen of its source, screenshot included: a link to a
    page the source visited is not drawn visited (the browser keeps no history: an off-the-record context, as
    Playwright's), no text caret is drawn (it blinks: timing), a click leaves the pointer off the page (hover would
    depend on when Chromium noticed it), a hover's pointer comes along. Each was a difference once."""
    _, ws, _ = await shop(runtime)
    await act(ws, "goto", url=f"{SHOP}/checkout/cart/")
    await act(ws, "goto", url=f"{SHOP}/customer/account/")
    home = await act(ws, "goto", url=f"{SHOP}/")  # its header links to the cart and the account: both visited
    search = element(home, "textbox", SEARCH)
    steps = [("type", {"element_id": search, "text": "boots", "press_enter_after": False}),  # a caret in the box
             ("click", {"element_id": element(home, "link", "My Cart")}),  # the pointer left on a link
             ("go_back", {}),
             ("hover", {"element_id": element(home, "link", "My Account")})]  # hovered on purpose
    for name, args in steps:
        await act(ws, name, **args)
        theirs = await act(ws, "observe")
        for _ in range(2):  # the same whenever it is taken: a caret's blink (~0.5 s a phase) must not show
            await asyncio.sleep(0.55)  # modelled: the time between two looks, not a wait for something to happen
            assert (await act(ws, "observe")).data["screenshot"] == theirs.data["screenshot"], name
        clone = await ws.fork()
        try:
            mine = await act(clone, "observe")
            assert mine.output == theirs.output, name
            assert mine.data["screenshot"] == theirs.data["screenshot"], f"the clone's screenshot differs after {name}"
        finally:
            await clone.close()
    await ws.close()


async def test_a_fork_carries_the_cart_cookie_and_never_posts_again(runtime) -> None:
    suite = WebShopSuite(catalog_size=CATALOG_SIZE, time_scale=0.0, browser="chromium")
    ws = await runtime.create(suite.app())
    await act(ws, "goto", url=f"{SHOP}{product_url(3)}")
    button = await act(ws, "_element", target="@button 'Add to Cart'")  # below the viewport: found in the whole tree
    cart = await act(ws, "click", element_id=button.data["element_id"])  # POST, then the cart (GET)
    assert cart.data["url"] == f"{SHOP}/checkout/cart/" and PRODUCTS[3].name in cart.output
    clone = await ws.fork()
    try:
        mine = await act(clone, "observe")
        assert mine.output == cart.output  # the session cookie came along: the server's forked cart is shown
        again = await act(clone, "goto", url=f"{SHOP}/checkout/cart/")
        assert again.output == cart.output  # one of it in the cart: nothing was posted a second time
        back = await act(clone, "go_back")
        assert back.data["url"] == f"{SHOP}{product_url(3)}"
    finally:
        await clone.close()
    await ws.close()


async def test_a_post_answer_is_served_to_the_clone_and_one_further_back_refuses_the_fork(runtime) -> None:
    suite = WebShopSuite(catalog_size=CATALOG_SIZE, time_scale=0.0, browser="chromium")
    ws = await runtime.create(suite.app())
    await act(ws, "goto", url=f"{SHOP}{product_url(5)}")
    add = await act(ws, "_element", target="@button 'Add to Cart'")
    await act(ws, "click", element_id=add.data["element_id"])
    await act(ws, "goto", url=f"{SHOP}/checkout/")
    button = await act(ws, "_element", target="@button 'Place Order'")
    answer = await act(ws, "click", element_id=button.data["element_id"])  # POST, answered 200
    assert "/checkout/placeorder" in answer.data["url"] and answer.data["status"] == 200
    clone = await ws.fork()
    try:
        mine = await act(clone, "observe")
        assert mine.output == answer.output and mine.data["url"] == answer.data["url"]
        back = await act(clone, "go_back")
        assert back.data["url"] == f"{SHOP}/checkout/"
    finally:
        await clone.close()
    await act(ws, "goto", url=f"{SHOP}/")  # the POST's answer is now further back in history
    with pytest.raises(Exception, match="BrowserStateUnsupported|going back to it would post again"):
        await ws.fork()
    still = await act(ws, "observe")  # the source goes on
    assert still.data["url"] == f"{SHOP}/"
    await ws.close()
    await runtime.close()
    assert not chromium_processes(runtime.run_id)

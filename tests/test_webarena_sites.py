"""WebArena's own tasks' workspace (``envs/webarena/app.py``): Debian's Chromium in a workspace reaching a
deployment's site through the egress proxy only (the embedded shop served outside any workspace stands in for
WebArena's shopping site), signing in with WebArena's account as WebArena's set-up does, acting in WebArena's
language, and evaluating program_html's JavaScript there; a clone's browser goes on where its source's was."""

from __future__ import annotations

import pytest

from bunshin.envs import AppSpec, Limits, ToolCall
from bunshin.envs.runtime.runtime import WorkspaceRuntime

from .shop_server import serve_shop

pytestmark = pytest.mark.asyncio
SITES_APP = "bunshin.envs.webarena.app:SitesApp"


async def call(ws: object, tool: str, **args: object) -> object:
    obs = await ws.execute(ToolCall(name=tool, args=args))  # type: ignore[attr-defined]
    return obs


async def test_chromium_reaches_the_site_signs_in_acts_and_evaluates(make_runtime) -> None:
    rt: WorkspaceRuntime = await make_runtime(limits=Limits(memory_bytes=4 << 30, pids=512, command_timeout_s=60))
    with serve_shop() as shop:
        port = int(shop.url.rsplit(":", 1)[1])
        ws = await rt.create(AppSpec(target=SITES_APP, image="chromium", egress=[f"127.0.0.1:{port}"]))
        signed = await call(ws, "_sign_in", site="shopping", url=shop.url)
        assert not signed.error and signed.output == f"{shop.url}/customer/account/", signed.error
        assert any(r.path == "/customer/account/loginPost/" for r in shop.requests)
        start = await call(ws, "_start", urls=[f"{shop.url}/", f"{shop.url}/checkout/cart/"])
        assert not start.error and "Tab 0 (current)" in start.output and "Tab 1" in start.output, start.error
        assert (await call(ws, "_url")).output == f"{shop.url}/"
        title = await call(ws, "_evaluate", script="document.title")
        assert title.data["value"] == "Home Page" and title.output == "Home Page", title
        login = await call(ws, "_evaluate", url=f"{shop.url}/customer/account/login/",
                           script="document.querySelector('.message').outerText")  # the browser's cookies
        assert login.output == "You are signed in as emma.lopez@gmail.com.", login.error
        # a clone's browser (its own Chromium, the same proxy) is where its source's was, signed in too
        clone = await ws.fork()
        assert (await call(clone, "_url")).output == f"{shop.url}/"
        again = await call(clone, "_evaluate", url=f"{shop.url}/customer/account/login/",
                           script="document.querySelector('.message').outerText")
        assert again.output == "You are signed in as emma.lopez@gmail.com.", again.error
        # anything but the site is out of reach, the agent's goto included
        refused = await call(clone, "goto", url="http://127.0.0.2:8099/")
        assert "bunshin egress: 127.0.0.2:8099 is not among this workspace's sites" in refused.output, refused
        assert clone.egress is not None and set(clone.egress.refused) == {"127.0.0.2:8099: not allowed"}
        await clone.close()
        await ws.close()


async def test_a_wrong_password_or_no_sign_in_form_is_a_typed_refusal(make_runtime) -> None:
    rt: WorkspaceRuntime = await make_runtime(limits=Limits(memory_bytes=4 << 30, pids=512, command_timeout_s=60))
    with serve_shop() as shop:
        port = int(shop.url.rsplit(":", 1)[1])
        ws = await rt.create(AppSpec(target=SITES_APP, image="chromium", egress=[f"127.0.0.1:{port}"]))
        # gitlab's recipe on the shop: its page has no such form
        wrong = await call(ws, "_sign_in", site="gitlab", url=shop.url)
        assert wrong.error and "sign-in to gitlab" in wrong.error and "not the sign-in form" in wrong.error
        unknown = await call(ws, "_sign_in", site="map", url=shop.url)
        assert unknown.error and "map has no sign-in" in unknown.error
        await ws.close()

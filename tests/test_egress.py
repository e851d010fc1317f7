"""A workspace's way out, allow-list only (``AppSpec.egress``): through the proxy at 127.0.0.1:3128 inside it, the
site named (the real shop, served outside any workspace) answers, to plain requests and through a CONNECT tunnel;
another port and another host are refused by name; the agent's shell reaches nothing directly; a clone has its own
proxy; a workspace without egress has none; closing leaves nothing."""

from __future__ import annotations

import contextlib
import functools
import http.server
import shlex
from collections.abc import Iterator

import pytest

from bunshin.envs import AppSpec, ToolCall
from bunshin.envs.runtime.egress import BadEgress, parse_allow
from bunshin.envs.runtime.runtime import WorkspaceRuntime

from .shop_server import serve_in_thread, serve_shop

FETCH = r"""
import socket, sys, urllib.error, urllib.request
how, url = sys.argv[1], sys.argv[2]
try:
    if how == "proxy":
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": "http://127.0.0.1:3128"}))
        answer = opener.open(url, timeout=20)
        print(answer.status, answer.read(4000).decode(errors="replace"))
    elif how == "direct":
        answer = urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=5)
        print(answer.status, answer.read(200).decode(errors="replace"))
    else:  # a CONNECT tunnel to host:port, then a plain GET through it
        s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
        s.sendall(f"CONNECT {url} HTTP/1.1\r\nHost: {url}\r\n\r\n".encode())
        head = s.recv(4096).decode()
        print(head.split("\r\n")[0])
        if " 200 " in head:
            s.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
            got = b""
            while chunk := s.recv(65536):
                got += chunk
            print(got[:4000].decode(errors="replace"))
except urllib.error.HTTPError as exc:
    print(exc.code, exc.read(400).decode(errors="replace"))
except OSError as exc:
    print("ERROR", type(exc).__name__, exc)
"""


class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = b"another server"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def other_server(host: str) -> Iterator[int]:
    """A server that would answer if reached: on ``host`` (127.0.0.2 is this machine too, another address)."""
    with serve_in_thread(http.server.ThreadingHTTPServer((host, 0), functools.partial(Hello))) as port:
        yield port


async def fetch(ws: object, how: str, url: str) -> str:
    obs = await ws.execute(ToolCall(name="shell", args={  # type: ignore[attr-defined]
        "cmd": f"python3 -c {shlex.quote(FETCH)} {how} {shlex.quote(url)}"}))
    assert not obs.error, obs.error
    return str(obs.output)


@pytest.mark.asyncio
async def test_a_workspace_reaches_its_sites_and_nothing_else(make_runtime) -> None:
    rt: WorkspaceRuntime = await make_runtime()
    with serve_shop() as shop, other_server("127.0.0.1") as other_port, other_server("127.0.0.2") as far_port:
        port = int(shop.url.rsplit(":", 1)[1])
        ws = await rt.create(AppSpec(egress=[f"127.0.0.1:{port}"]))
        # the site, through the proxy: the shop's home page, as a browser would get it
        home = await fetch(ws, "proxy", f"{shop.url}/")
        assert home.startswith("200 ") and "<html" in home.lower(), home
        assert shop.requests, "the shop saw no request"
        tunnel = await fetch(ws, "connect", f"127.0.0.1:{port}")
        assert tunnel.startswith("HTTP/1.1 200 Connection Established") and "<html" in tunnel.lower(), tunnel
        # another port of the same host, another host: refused by the proxy, naming them; their servers never asked
        other = await fetch(ws, "proxy", f"http://127.0.0.1:{other_port}/")
        assert other.startswith("403 ") and f"127.0.0.1:{other_port} is not among this workspace's sites" in other
        far = await fetch(ws, "proxy", f"http://127.0.0.2:{far_port}/")
        assert far.startswith("403 ") and f"127.0.0.2:{far_port} is not among" in far
        assert (await fetch(ws, "connect", f"127.0.0.2:{far_port}")).startswith("HTTP/1.1 403 Forbidden")
        # the agent's shell without the proxy: no route anywhere (its namespace has only its own loopback)
        direct = await fetch(ws, "direct", f"{shop.url}/")
        assert direct.startswith("ERROR "), direct
        assert ws.egress is not None and list(ws.egress.refused) == [
            f"127.0.0.1:{other_port}: not allowed", f"127.0.0.2:{far_port}: not allowed",
            f"127.0.0.2:{far_port}: not allowed"]
        # a clone has a proxy of its own, in its own namespace, with the same list
        clone = await ws.fork()
        assert (await fetch(clone, "proxy", f"{shop.url}/")).startswith("200 ")
        assert (await fetch(clone, "proxy", f"http://127.0.0.1:{other_port}/")).startswith("403 ")
        await ws.close()
        assert (await fetch(clone, "proxy", f"{shop.url}/")).startswith("200 ")  # the source's proxy is not its
        await clone.close()
        # no egress declared: no proxy at all
        closed = await rt.create(AppSpec())
        assert (await fetch(closed, "proxy", f"{shop.url}/")).startswith("ERROR ")
        assert closed.egress is None
        await closed.close()


@pytest.mark.asyncio
async def test_a_site_that_does_not_answer_is_a_502_naming_it(make_runtime) -> None:
    rt: WorkspaceRuntime = await make_runtime()
    with other_server("127.0.0.1") as port:
        pass  # its port is free again: nothing listens there
    ws = await rt.create(AppSpec(egress=[f"127.0.0.1:{port}"]))
    answer = await fetch(ws, "proxy", f"http://127.0.0.1:{port}/")
    assert answer.startswith("502 ") and f"127.0.0.1:{port} does not answer" in answer
    await ws.close()


@pytest.mark.parametrize("entry", ["shop.example", "http://shop.example:80", "shop.example:http", ":80", "a:99999"])
def test_a_bad_egress_entry_is_refused_naming_it(entry: str) -> None:
    with pytest.raises(BadEgress, match="expected host:port"):
        parse_allow([entry])
    assert parse_allow(["Shop.Example:7770", "[::1]:80"]) == {("shop.example", 7770), ("::1", 80)}


@pytest.mark.asyncio
async def test_what_the_proxy_keeps_of_its_refusals_is_bounded() -> None:
    """An agent may ask for what it may not have forever: the proxy keeps the latest refusals only. (Its listening
    port is made in this process's own network namespace here: no workspace is needed to ask it.)"""
    import asyncio
    import os

    from bunshin.envs.runtime import egress

    proxy = egress.EgressProxy(parse_allow(["127.0.0.1:1"]))
    await proxy.start(os.getpid())
    try:
        for i in range(egress.KEPT_REFUSALS + 5):
            reader, writer = await asyncio.open_connection("127.0.0.1", egress.EGRESS_PORT)
            writer.write(f"GET http://10.0.0.{i % 250 + 1}:80/ HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert (await reader.readline()).startswith(b"HTTP/1.1 403 ")
            writer.close()
        assert len(proxy.refused) == egress.KEPT_REFUSALS
        assert proxy.refused[-1] == f"10.0.0.{(egress.KEPT_REFUSALS + 4) % 250 + 1}:80: not allowed"
    finally:
        await proxy.close()

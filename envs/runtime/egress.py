"""A workspace's way out, allow-list only: an HTTP proxy on the engine's side that a workspace reaches on
127.0.0.1:``EGRESS_PORT`` inside its own network namespace, and that connects to the host:port pairs its app
declares (``AppSpec.egress``: a WebArena deployment's sites) and to nothing else.

Owns: ``parse_allow`` (the declared ``host:port`` entries, checked) and ``EgressProxy``: the listening socket made in
the workspace's namespace (``ports.listen_inside``), and per connection one request (``Connection: close``): a
``CONNECT host:port`` tunnel, or a plain HTTP request with an absolute URL, forwarded in origin form; anything else
refused with a status that names the host and port (403 not allowed, 400 malformed, 502 unreachable). The head it
reads is bounded (``MAX_HEAD``) and must arrive within ``HEAD_TIMEOUT_S``; a connection out has
``CONNECT_TIMEOUT_S``.
Why a proxy on the engine's side: a workspace's network namespace has only its loopback, so the agent's commands
have no route out; the proxy decides by the target the browser names, before any connection is made, and the agent
cannot widen the list (it can only ask the same proxy). The default stays no network at all: a workspace whose app
declares no egress has no proxy.
Must never: connect anywhere not on the list, listen beyond the workspace's loopback, or leave a connection open
after ``close()``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import urllib.parse

from ..errors import EnvsError
from .ports import listen_inside
from .relay import pump

EGRESS_PORT = 3128  # inside every workspace with egress: http://127.0.0.1:3128 is its proxy
MAX_HEAD = 64 << 10  # a request's line and headers
HEAD_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 10.0
KEPT_REFUSALS = 1000
_DROPPED = {"proxy-connection", "proxy-authorization", "connection", "keep-alive"}


class BadEgress(EnvsError, ValueError):
    """An egress entry that is not ``host:port``: names it."""


def parse_allow(entries: list[str]) -> frozenset[tuple[str, int]]:
    """``["shop.example:7770", "[::1]:80"]`` as (lower-case host, port) pairs; ``BadEgress`` naming a bad one."""
    allowed = set()
    for entry in entries:
        host, port = _split_host_port(entry)
        if host is None or port is None:
            raise BadEgress(f"egress entry {entry!r}: expected host:port")
        allowed.add((host, port))
    return frozenset(allowed)


def _split_host_port(text: str) -> tuple[str | None, int | None]:
    parsed = urllib.parse.urlsplit(f"//{text.strip()}")
    try:
        port = parsed.port
    except ValueError:
        return None, None
    if not parsed.hostname or port is None or parsed.path or parsed.username is not None:
        return None, None
    return parsed.hostname.lower(), port


class EgressProxy:
    """``await EgressProxy(allowed).start(pid)``: the proxy of the workspace whose host is ``pid``."""

    def __init__(self, allowed: frozenset[tuple[str, int]]):
        self.allowed = allowed
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        # what it said no to, the latest ``KEPT_REFUSALS`` in order ("host:port: why"): an agent may ask forever
        self.refused: collections.deque[str] = collections.deque(maxlen=KEPT_REFUSALS)

    async def start(self, pid: int) -> None:
        sock = await asyncio.to_thread(listen_inside, pid, EGRESS_PORT)
        try:
            self._server = await asyncio.start_server(self._serve, sock=sock, limit=MAX_HEAD)
        except BaseException:
            sock.close()
            raise

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            for writer in list(self._open):
                writer.close()
            await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open.add(writer)
        upstream: asyncio.StreamWriter | None = None
        try:
            try:
                async with asyncio.timeout(HEAD_TIMEOUT_S):
                    head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
                await self._answer(writer, 400, "Bad Request", "bunshin egress: no complete request head")
                return
            lines = head.decode("latin-1").split("\r\n")
            method, target, version = (lines[0].split(" ") + ["", "", ""])[:3]
            if method == "CONNECT":
                host, port = _split_host_port(target)
                rest = b""
            else:
                url = urllib.parse.urlsplit(target)
                host = url.hostname.lower() if url.scheme == "http" and url.hostname else None
                try:
                    port = (url.port or 80) if host else None
                except ValueError:
                    port = None
                path = urllib.parse.urlunsplit(("", "", url.path or "/", url.query, ""))
                headers = [h for h in lines[1:] if h and h.split(":", 1)[0].strip().lower() not in _DROPPED]
                rest = "\r\n".join([f"{method} {path} {version}", *headers, "Connection: close", "", ""]).encode(
                    "latin-1")
            if host is None or port is None or not version.startswith("HTTP/"):
                await self._answer(writer, 400, "Bad Request",
                                   f"bunshin egress: {lines[0][:200]!r} is not a proxy request for an http URL or a "
                                   f"CONNECT to host:port")
                return
            if (host, port) not in self.allowed:
                self.refused.append(f"{host}:{port}: not allowed")
                await self._answer(writer, 403, "Forbidden", f"bunshin egress: {host}:{port} is not among this "
                                                             f"workspace's sites")
                return
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    up_reader, upstream = await asyncio.open_connection(host, port)
            except (OSError, TimeoutError) as exc:
                self.refused.append(f"{host}:{port}: unreachable")
                await self._answer(writer, 502, "Bad Gateway", f"bunshin egress: {host}:{port} does not answer "
                                                               f"({type(exc).__name__}: {exc})")
                return
            self._open.add(upstream)
            if method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                await writer.drain()
            else:
                upstream.write(rest)
            # the answer's end (the site closes: Connection: close, or the tunnel's far end) ends the exchange;
            # a client that keeps its side open (a browser's idle connection) does not hold it
            async with asyncio.TaskGroup() as pumps:
                sending = pumps.create_task(pump(reader, upstream))
                await pump(up_reader, writer)
                sending.cancel()
        except (ConnectionError, OSError):
            pass
        finally:
            for w in (writer, upstream):
                if w is not None:
                    w.close()
                    self._open.discard(w)

    @staticmethod
    async def _answer(writer: asyncio.StreamWriter, status: int, reason: str, text: str) -> None:
        body = (text + "\n").encode()
        writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        with contextlib.suppress(ConnectionError, OSError):
            await writer.drain()

"""HTTP for the text browser, within bounds a page cannot push past.

Owns: ``Loader`` (the opener and its handlers, around the browser's cookie jar), ``Response`` (with its body
decoded by the declared character set, web encodings only), ``join_url``, ``Deadline`` (one budget of
seconds for a whole load: every connection it opens, redirects included, shares it, and each socket operation
waits at most the time left, so a server that trickles its headers or body a byte at a time cannot stall a load),
``BoundedCookieJar`` (a browser's cookie limits), and turning what urllib and http.client raise into
``BrowserError`` messages for the agent.

- Only ``http``/``https``, with no proxy, also across redirects (urllib would follow one to ``ftp:``); at most
  urllib's 10 redirects per load, and a loop is refused (``ERR_TOO_MANY_REDIRECTS``, as a browser says). A
  redirect's own body is never read.
- A body is read up to the caller's ``max_bytes`` (the rest is not read: ``Response.truncated``); headers are
  bounded by http.client (100 lines of at most 64 KiB).
- Cookies: at most ``MAX_COOKIE_BYTES`` of name and value each, ``MAX_COOKIES_PER_DOMAIN`` per domain and
  ``MAX_COOKIES`` in all (the oldest go first), as browsers bound them: the jar is agent-controlled memory.
Must never: parse HTML, know about tabs, or wait on a socket past a load's deadline (https: per operation, see
``_connect``).
"""

from __future__ import annotations

import codecs
import http.client
import http.cookiejar
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from .errors import BrowserError

USER_AGENT = "Mozilla/5.0 (X11; Linux x86_64) BunshinTextBrowser/0.1"
READ_CHUNK = 64 << 10
# Per RFC 6265 section 6.1 a browser stores cookies of at least 4096 bytes, 50 per domain and 3000 in all; browsers
# keep about that many (Chromium: 180 per domain, 3300 in all). More is refused or evicts the oldest.
MAX_COOKIE_BYTES = 4096
MAX_COOKIES_PER_DOMAIN = 180
MAX_COOKIES = 3000
# Character sets a document may declare, as the Encoding Standard's (Python's names); any other is read as UTF-8
# (some Python codecs are not text encodings, or are slow: punycode is quadratic).
WEB_ENCODINGS = frozenset({
    "utf-8", "utf-16", "utf-16-le", "utf-16-be", "ascii", "cp866", "koi8-r", "koi8-u", "mac-roman", "mac-cyrillic",
    "cp874", "tis-620", "gbk", "gb18030", "gb2312", "big5", "big5hkscs", "euc_jp", "iso2022_jp", "shift_jis",
    "cp932", "euc_kr", "cp949", *(f"iso8859-{n}" for n in range(1, 17)), *(f"cp{n}" for n in range(1250, 1259))})


class Deadline:
    """A budget of seconds that started when it was made."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        return self.at - time.monotonic()

    def timeout(self) -> float:
        """The time left, for one socket operation; ``socket.timeout`` when there is none."""
        left = self.left()
        if left <= 0:
            raise TimeoutError(f"the load's {self.seconds:g} s were used up")
        return left


class _DeadlineSocket(socket.socket):
    """A TCP socket whose every blocking operation waits at most until the load's deadline (not a fresh timeout
    per operation, which a server trickling bytes renews forever). http.client reads through ``recv_into``."""

    __slots__ = ("deadline",)
    deadline: Deadline

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        self.settimeout(self.deadline.timeout())
        return super().recv_into(buffer, nbytes, flags)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        self.settimeout(self.deadline.timeout())
        return super().recv(bufsize, flags)

    def sendall(self, data: Any, flags: int = 0) -> None:
        self.settimeout(self.deadline.timeout())
        super().sendall(data, flags)


def _connect(address: tuple[str, int], deadline: Deadline, source: tuple[str, int] | None = None) -> socket.socket:
    """``socket.create_connection`` with a ``_DeadlineSocket``. (An https connection wraps it in an SSL socket,
    whose operations then each wait up to the time left when the connection was made.)"""
    host, port = address
    error: OSError | None = None
    for family, kind, proto, _, target in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
        sock = _DeadlineSocket(family, kind, proto)
        sock.deadline = deadline
        try:
            sock.settimeout(deadline.timeout())
            if source:
                sock.bind(source)
            sock.connect(target)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError as exc:
            error = exc
            sock.close()
    raise error if error is not None else OSError(f"no address for {host}")


class _HTTPHandler(urllib.request.HTTPHandler):
    """Plain HTTP through ``_DeadlineSocket``s; ``deadline`` is set by the loader before each load."""

    deadline: Deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        deadline = self.deadline

        def connection(host: str, **kwargs: Any) -> http.client.HTTPConnection:
            conn = http.client.HTTPConnection(host, **kwargs)
            conn._create_connection = lambda address, timeout=None, source=None: _connect(  # type: ignore[attr-defined]
                address, deadline, source)
            return conn

        return self.do_open(connection, req)


class _RedirectHandler(urllib.request.HTTPRedirectHandler):
    """urllib's redirects (a 301/302/303 after a POST becomes a GET), to http(s) only, without reading the
    redirect's body."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> urllib.request.Request | None:
        if urllib.parse.urlsplit(newurl).scheme not in ("http", "https"):
            if fp is not None:
                fp.close()
            raise BrowserError(f"{req.full_url} redirected to {newurl[:200]!r}, which this browser does not open "
                               f"(only http and https)")
        followed = super().redirect_request(req, fp, code, msg, headers, newurl)  # a refusal shows its page
        if fp is not None:
            fp.close()  # nothing of a followed redirect's body is needed (urllib would read all of it)
        return followed


class BoundedCookieJar(http.cookiejar.CookieJar):
    """The standard jar (Set-Cookie parsing, Path/Domain matching, expiry; cookies of intermediate redirects
    kept) with a browser's limits (see the module constants)."""

    def set_cookie(self, cookie: http.cookiejar.Cookie) -> None:
        if len(cookie.name) + len(cookie.value or "") > MAX_COOKIE_BYTES:
            return  # refused, as browsers refuse an oversized cookie
        with self._cookies_lock:  # type: ignore[attr-defined]
            super().set_cookie(cookie)
            self._evict(cookie.domain)

    def _evict(self, domain: str) -> None:
        """Oldest first (the jar's dicts keep insertion order): per domain, then in all."""
        def cookies(of: dict[str, Any]) -> list[tuple[str, str, str]]:
            return [(d, path, name) for d, paths in of.items() for path, names in paths.items() for name in names]
        mine = cookies({domain: self._cookies.get(domain, {})})  # type: ignore[attr-defined]
        for d, path, name in mine[:max(0, len(mine) - MAX_COOKIES_PER_DOMAIN)]:
            self.clear(d, path, name)
        every = cookies(self._cookies)  # type: ignore[attr-defined]
        for d, path, name in every[:max(0, len(every) - MAX_COOKIES)]:
            self.clear(d, path, name)


@dataclass(frozen=True, slots=True)
class Response:
    """A loaded response: final URL (after redirects), status, content type and charset, the body read, and
    whether the body went on past ``max_bytes``."""

    url: str
    status: int
    content_type: str
    charset: str | None
    body: bytes
    truncated: bool

    def text(self) -> str:
        """The body decoded with its declared character set if a web encoding (``WEB_ENCODINGS``), else UTF-8;
        undecodable bytes become U+FFFD."""
        try:
            name = codecs.lookup(self.charset).name if self.charset else "utf-8"
        except LookupError:
            name = "utf-8"
        return self.body.decode(name if name in WEB_ENCODINGS else "utf-8", errors="replace")


def join_url(base: str, ref: str) -> str:
    """``ref`` (a URL typed, a link, a form's action, an image) resolved against ``base``; ``BrowserError`` when
    it is not a valid URL."""
    try:
        joined = urllib.parse.urljoin(base, ref)
        urllib.parse.urlsplit(joined)
    except ValueError as error:  # e.g. an unclosed IPv6 literal
        raise BrowserError(f"cannot open {ref[:200]!r}: not a valid URL ({error})") from error
    return joined


class Loader:
    """Loads URLs with the browser's cookies, within a deadline and a size bound per load."""

    def __init__(self, cookies: http.cookiejar.CookieJar):
        self._http = _HTTPHandler()
        self._opener = urllib.request.OpenerDirector()
        for handler in (urllib.request.ProxyHandler({}), urllib.request.UnknownHandler(), self._http,
                        urllib.request.HTTPSHandler(), urllib.request.HTTPDefaultErrorHandler(), _RedirectHandler(),
                        urllib.request.HTTPErrorProcessor(), urllib.request.HTTPCookieProcessor(cookies)):
            self._opener.add_handler(handler)

    def load(self, url: str, deadline: Deadline, max_bytes: int, data: bytes | None = None,
             accept: str = "text/html,*/*;q=0.8") -> Response:
        """GET (or POST ``data``) ``url`` following redirects; a 4xx/5xx is a response (its page is shown).
        ``BrowserError`` when the site cannot be reached, redirects too often, or the deadline passes."""
        headers = {"User-Agent": USER_AGENT, "Accept": accept}
        if data is not None:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        request = urllib.request.Request(url, data=data, headers=headers, method="POST" if data is not None else "GET")
        self._http.deadline = deadline
        try:
            response = self._opener.open(request, timeout=deadline.timeout())
        except urllib.error.HTTPError as error:  # a 4xx/5xx page is shown, not refused
            if error.code in (301, 302, 303, 307, 308) and str(error.msg).startswith(_RedirectHandler.inf_msg):
                error.close()
                raise BrowserError(f"cannot open {url}: it redirects too many times (a redirect loop, "
                                   f"ERR_TOO_MANY_REDIRECTS)") from error
            response = error
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as error:  # ValueError:
            # a URL http.client cannot send (non-ASCII, a bad port or IPv6 literal), here or in a redirect
            raise BrowserError(_failure(url, deadline, getattr(error, "reason", error), "cannot reach")) from error
        try:
            status = getattr(response, "status", None) or response.getcode() or 0
            final = response.geturl() or url
            body, truncated = _read(response, max_bytes)
            content_type = response.headers.get_content_type() if response.headers else "text/html"
            charset = response.headers.get_content_charset() if response.headers else None
        except (http.client.HTTPException, OSError, ValueError) as error:
            raise BrowserError(_failure(url, deadline, error, "the connection broke while loading")) from error
        finally:
            response.close()
        return Response(final, int(status), content_type, charset, body, truncated)


def _read(response: Any, max_bytes: int) -> tuple[bytes, bool]:
    """Up to ``max_bytes`` of the body, and whether more was there. ``read1`` returns what one socket read gave,
    so every wait is a ``_DeadlineSocket`` operation."""
    read = getattr(response, "read1", None) or response.read
    chunks, size = [], 0
    while size <= max_bytes:
        chunk = read(min(READ_CHUNK, max_bytes + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    body = b"".join(chunks)
    return body[:max_bytes], len(body) > max_bytes


def _failure(url: str, deadline: Deadline, reason: object, what: str) -> str:
    if deadline.left() <= 0 or isinstance(reason, TimeoutError):
        return (f"{url} did not finish loading within {deadline.seconds:g} s (the browser's time for one page); "
                f"the page was left as it was")
    return f"{what} {url}: {reason}"

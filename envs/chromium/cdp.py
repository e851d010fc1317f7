"""A Chrome DevTools Protocol connection over Chromium's ``--remote-debugging-pipe``, for the workspace host.

Owns: framing (JSON messages ended by a NUL byte: commands on the browser's descriptor 3, replies and events on
its descriptor 4), matching replies to commands by id, keeping the events that came meanwhile (bounded), and
bounds on what the browser can make the host hold: one message at most ``max_message`` bytes, every wait ending at
a deadline. Synchronous: the host serves one request at a time and a tool's deadline is the runtime's.
Why not Playwright (what WebArena and BrowserGym drive Chromium with): its Node driver costs ~125 MiB per driver
(measured, issue 24), one per workspace would dwarf what forks share, and one for the whole machine would put every
workspace's page traffic (accessibility trees of any size, screenshots) on the engine's event loop, outside the
workspace's memory and CPU limits. The protocol over a pipe needs only this.
Must never: block past a deadline, or grow without bound on what a page sends (a message over the bound is
dropped as it streams in; the command it answered fails, the connection goes on).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec

from ..errors import EnvsError

MAX_MESSAGE = 64 << 20  # an accessibility tree of a huge page, a full-page screenshot: beyond it, refused
MAX_EVENTS = 4096  # events kept while waiting for a reply (the oldest are dropped)
_READ = 1 << 20


class CdpError(EnvsError):
    """The browser answered a command with an error, or the connection broke; names the method."""


class CdpTimeout(CdpError):
    """A command or an awaited event did not come before its deadline."""


class MessageTooLarge(CdpError):
    """The browser's answer (or event) was over the bound; it is dropped, the connection goes on."""


class BrowserGone(CdpError):
    """The browser closed its end of the pipe (it exited or was killed)."""


class CdpPipe:
    """One browser's DevTools pipe: ``write_fd`` is our end of its descriptor 3, ``read_fd`` of its 4."""

    def __init__(self, write_fd: int, read_fd: int, max_message: int = MAX_MESSAGE,
                 keep: frozenset[str] | None = None, on_event: Callable[[dict[str, Any]], None] | None = None,
                 handed: dict[str, Any] | None = None):
        """``keep``: the event methods worth keeping (None: all); ``on_event``: called with each event as it
        comes, before it is kept (it may ``send`` with ``forget=True``, e.g. to dismiss a dialog); ``handed``:
        the connection's state from another process's ``hand_over`` (the same pipe, taken over mid-stream)."""
        self.write_fd, self.read_fd, self.max_message = write_fd, read_fd, max_message
        self.keep, self.on_event = keep, on_event
        self._forgotten: set[int] = set()
        os.set_blocking(read_fd, False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(read_fd, selectors.EVENT_READ)
        self._buffer = bytearray()
        self._discarding = False  # inside a message over max_message: dropped up to its end
        self._next_id = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self.events: deque[dict[str, Any]] = deque(maxlen=MAX_EVENTS)
        self._encoder = msgspec.json.Encoder()
        self._decoder = msgspec.json.Decoder()
        self.closed = False
        if handed is not None:
            self._next_id = int(handed["next_id"])
            self._forgotten = {int(i) for i in handed["forgotten"]}
            self._buffer = bytearray(handed["pending"])
            self._discarding = bool(handed["discarding"])
            self.events.extend(handed["events"])

    def hand_over(self) -> dict[str, Any]:
        """The connection's state for another process to go on with the same pipe (``handed``): the next command
        id, the answers nobody waits for, a message read in part, the kept events. This end is never read
        again: its descriptors stay open (the other process copies them) but the selector is closed."""
        self.pump()
        state = {"next_id": self._next_id, "forgotten": sorted(self._forgotten), "pending": bytes(self._buffer),
                 "discarding": self._discarding, "events": list(self.events)}
        self.closed = True
        self._selector.close()
        return state

    # -- commands -------------------------------------------------------------------------------------------------
    def send(self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None,
             forget: bool = False) -> int:
        """Send a command without waiting; its id (``reply(id, ...)`` waits for the answer; ``forget``: its
        answer is dropped when it comes)."""
        if self.closed:
            raise BrowserGone(f"{method}: the DevTools pipe is closed")
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        data = self._encoder.encode(message) + b"\0"
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.write_fd, view):]
        except BrokenPipeError as exc:
            raise BrowserGone(f"{method}: the browser closed its DevTools pipe") from exc
        if forget:
            self._forgotten.add(self._next_id)
        return self._next_id

    def reply(self, command_id: int, method: str, deadline: float) -> dict[str, Any]:
        """The result of command ``command_id`` (``method`` names it in errors), read until ``deadline``."""
        while command_id not in self._replies:
            self._read_some(method, deadline)
        answer = self._replies.pop(command_id)
        if "error" in answer:
            error = answer["error"]
            raise CdpError(f"{method}: {error.get('message', error)} ({error.get('data', '')})".rstrip(" ()"))
        result = answer.get("result", {})
        return result if isinstance(result, dict) else {}

    def call(self, method: str, params: dict[str, Any] | None = None, *, deadline: float,
             session: str | None = None) -> dict[str, Any]:
        """Send ``method`` and wait for its result until ``deadline`` (``time.monotonic()``)."""
        return self.reply(self.send(method, params, session=session), method, deadline)

    # -- events ---------------------------------------------------------------------------------------------------
    def take_events(self, method: str, session: str | None = None) -> list[dict[str, Any]]:
        """The kept events named ``method`` (for ``session`` when given), removed from the kept ones."""
        taken = [e for e in self.events if e.get("method") == method
                 and (session is None or e.get("sessionId") == session)]
        if taken:
            kept = [e for e in self.events if not any(e is t for t in taken)]
            self.events.clear()
            self.events.extend(kept)
        return taken

    def wait_event(self, method: str, deadline: float, session: str | None = None) -> dict[str, Any]:
        """The first event ``method`` (for ``session``), waiting until ``deadline`` if none is kept yet."""
        while True:
            taken = self.take_events(method, session)
            if taken:
                for later in reversed(taken[1:]):
                    self.events.appendleft(later)
                return taken[0]
            self._read_some(method, deadline)

    def pump(self) -> None:
        """Read whatever has arrived, without waiting."""
        with contextlib.suppress(CdpTimeout):
            self._read_some("pump", time.monotonic())

    # -- reading ------------------------------------------------------------------------------------------------
    def _read_some(self, what: str, deadline: float) -> None:
        if self.closed:
            raise BrowserGone(f"{what}: the DevTools pipe is closed")
        left = deadline - time.monotonic()
        if left < 0 or not self._selector.select(max(left, 0)):
            if time.monotonic() >= deadline:
                raise CdpTimeout(f"{what}: no answer from the browser before the deadline")
            return
        try:
            chunk = os.read(self.read_fd, _READ)
        except BlockingIOError:
            return
        if not chunk:
            self.close()
            raise BrowserGone(f"{what}: the browser closed its DevTools pipe")
        start = 0
        end = chunk.find(b"\0")
        while end >= 0:
            if self._discarding:  # the end of a message too large to keep
                self._discarding = False
            else:
                self._buffer += chunk[start:end]
                self._accept(bytes(self._buffer), what)
            self._buffer.clear()
            start = end + 1
            end = chunk.find(b"\0", start)
        if self._discarding:
            return
        self._buffer += chunk[start:]
        if len(self._buffer) > self.max_message:
            self._buffer.clear()
            self._discarding = True  # the rest of this message is dropped as it comes, up to its end
            raise MessageTooLarge(f"{what}: a message from the browser is over {self.max_message} bytes: refused")

    def _accept(self, raw: bytes, what: str) -> None:
        if len(raw) > self.max_message:
            raise MessageTooLarge(f"{what}: a message from the browser is over {self.max_message} bytes: refused")
        try:
            message = self._decoder.decode(raw)
        except msgspec.DecodeError as exc:
            raise CdpError(f"{what}: the browser sent what is not JSON: {exc}") from exc
        if not isinstance(message, dict):
            return
        if "id" in message:
            command_id = int(message["id"])
            if command_id in self._forgotten:
                self._forgotten.discard(command_id)
            else:
                self._replies[command_id] = message
            return
        if self.on_event is not None:
            self.on_event(message)
        if self.keep is None or message.get("method") in self.keep:
            self.events.append(message)

    def close(self) -> None:
        """Close both ends (the browser sees its pipe close)."""
        if self.closed:
            return
        self.closed = True
        self._selector.close()
        for fd in (self.write_fd, self.read_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

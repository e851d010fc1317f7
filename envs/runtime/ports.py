"""Sockets made in a workspace's network namespace from the engine: a connection to a port inside (what a harness on
the engine's side reaches: Chromium's DevTools in a desktop workspace, VLC's HTTP interface) and a port listening
inside (what the egress proxy answers on, ``egress.py``).

Owns: connecting to, and listening on, 127.0.0.1:<port> in a workspace's network namespace. A socket belongs to the
namespace it was made in: a thread of its own enters the namespace, makes it, and ends, so no thread of the engine
changes namespace.
Must never: leave an engine thread in a workspace's namespace, or open the namespace to anything but those two.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable

from . import syscalls


def connect_inside(pid: int, port: int, timeout_s: float = 10.0) -> socket.socket:
    """A socket connected to 127.0.0.1:``port`` in the network namespace of process ``pid`` (a workspace's host).
    Raises OSError (``ConnectionRefusedError`` when nothing listens there)."""
    sock = _made_inside(pid, lambda: socket.create_connection(("127.0.0.1", port), timeout=timeout_s),
                        f"connect-inside-{pid}:{port}")
    sock.settimeout(None)
    return sock


def listen_inside(pid: int, port: int) -> socket.socket:
    """A non-blocking socket listening on 127.0.0.1:``port`` in the network namespace of process ``pid``: what a
    program there reaches the engine's side by (the egress proxy, ``egress.py``). Raises OSError (the port is
    taken)."""

    def bind_and_listen() -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
            sock.listen(128)
        except BaseException:
            sock.close()
            raise
        return sock

    sock = _made_inside(pid, bind_and_listen, f"listen-inside-{pid}:{port}")
    sock.setblocking(False)
    return sock


def _made_inside(pid: int, make: Callable[[], socket.socket], name: str) -> socket.socket:
    """``make()`` run on a thread of its own that entered ``pid``'s network namespace and ends right after: the
    socket it made belongs to that namespace; no thread of the engine changes namespace."""
    ns_fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    made: list[socket.socket] = []
    failed: list[BaseException] = []

    def enter_and_make() -> None:
        try:
            syscalls.setns(ns_fd, syscalls.CLONE_NEWNET)  # this thread only, and it ends right after
            made.append(make())
        except BaseException as exc:  # noqa: BLE001 (handed to the caller's thread)
            failed.append(exc)

    try:
        worker = threading.Thread(target=enter_and_make, name=name, daemon=True)
        worker.start()
        worker.join()
    finally:
        os.close(ns_fd)
    if failed:
        raise failed[0]
    return made[0]

"""A TCP connection from the engine to a port inside a workspace: what a harness on the engine's side reaches
(Chromium's DevTools in a desktop workspace, VLC's HTTP interface), never the other way round.

Owns: connecting to 127.0.0.1:<port> in a workspace's network namespace. A socket belongs to the namespace it
was made in: a thread of its own enters the namespace, connects, and ends, so no thread of the engine changes
namespace.
Must never: leave an engine thread in a workspace's namespace, or open the namespace to anything but a connect.
"""

from __future__ import annotations

import os
import socket
import threading

from . import syscalls


def connect_inside(pid: int, port: int, timeout_s: float = 10.0) -> socket.socket:
    """A socket connected to 127.0.0.1:``port`` in the network namespace of process ``pid`` (a workspace's host).
    Raises OSError (``ConnectionRefusedError`` when nothing listens there)."""
    ns_fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    made: list[socket.socket] = []
    failed: list[BaseException] = []

    def enter_and_connect() -> None:
        try:
            syscalls.setns(ns_fd, syscalls.CLONE_NEWNET)  # this thread only, and it ends right after
            made.append(socket.create_connection(("127.0.0.1", port), timeout=timeout_s))
        except BaseException as exc:  # noqa: BLE001 (handed to the caller's thread)
            failed.append(exc)

    try:
        worker = threading.Thread(target=enter_and_connect, name=f"connect-inside-{pid}:{port}", daemon=True)
        worker.start()
        worker.join()
    finally:
        os.close(ns_fd)
    if failed:
        raise failed[0]
    sock = made[0]
    sock.settimeout(None)
    return sock

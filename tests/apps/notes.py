"""A small workspace application with the two kinds of state a fork must rebind: an open journal file and a
listening TCP socket on the workspace's loopback. It is the contract's example and its after-fork test subject.

Owns: a journal (``ctx.open``) that every ``append`` writes through the same open file, and a socket
(``ctx.listen``) whose pending connections ``drain`` accepts and reads.
"""

from __future__ import annotations

import os
from typing import Any

from bunshin.envs.app import AppContext, Tool, WorkspaceApp
from bunshin.envs.records import Observation


class NotesApp(WorkspaceApp):
    def __init__(self, path: str = "/home/agent/journal.txt", port: int = 7070):
        self.path, self.port = path, port
        self.notes: list[str] = []

    def setup(self, ctx: AppContext) -> None:
        self.ctx = ctx
        self.journal = ctx.open(self.path, "a")
        os.chown(self.path, 65000, 65000)
        self.server = ctx.listen(self.port)

    def tools(self) -> dict[str, Tool]:
        return {"append": self._append, "notes": self._notes, "drain": self._drain, "port": self._port}

    def _append(self, args: dict[str, Any]) -> Observation:
        text = str(args["text"])
        self.notes.append(text)
        self.journal.file.write(text + "\n")
        self.journal.file.flush()
        return Observation(output=f"{len(self.notes)} notes")

    def _notes(self, args: dict[str, Any]) -> Observation:
        return Observation(output="\n".join(self.notes))

    def _port(self, args: dict[str, Any]) -> Observation:
        return Observation(output=str(self.server.port))

    def _drain(self, args: dict[str, Any]) -> Observation:
        """Accept every pending connection and return what each sent."""
        received = []
        self.server.sock.setblocking(False)
        try:
            while True:
                try:
                    conn, _ = self.server.sock.accept()
                except BlockingIOError:
                    break
                with conn:
                    conn.setblocking(True)
                    conn.settimeout(2)
                    received.append(conn.recv(1024).decode())
        finally:
            self.server.sock.setblocking(True)
        return Observation(output="\n".join(received), data={"connections": len(received)})

    def close(self) -> None:
        self.journal.close()
        self.server.close()


def connect_and_send(port: int, text: str) -> str:
    """The agent-side command that talks to the app's socket (used by tests and examples)."""
    return (f"python3 -c \"import socket; s = socket.create_connection(('127.0.0.1', {port}), timeout=2); "
            f"s.sendall(b'{text}'); s.close(); print('sent')\"")



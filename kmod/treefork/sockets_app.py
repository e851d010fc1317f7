# SPDX-License-Identifier: GPL-2.0
"""A workload for the tree fork (`treefork: sockets`), run by the host's Python inside a container: a server (pid 1)
listening on a Unix socket at /tmp/srv.sock, on an abstract Unix name and on TCP 127.0.0.1:8123, with two children:

- a pinger, connected to the server by a socket pair: it sends a counter, the server answers it plus one, over and
  over, several messages in flight at a time (a byte lost, duplicated or reordered in flight is caught);
- a client, connected to /tmp/srv.sock (an accepted connection): it sends a line a tick and checks the echo.

It also holds a netlink route socket bound to the link group. Every 0.1 s the server rewrites /tmp/sockets.out:
"pings P echoes E bad B fresh F netlink N". Once /tmp/go exists, the server connects afresh to each of its own three
listeners and counts in F the ones that answered, and asks its netlink socket for the links of its network namespace,
counting in N the links it is told of.
"""

import contextlib
import os
import selectors
import socket
import struct
import time

PIPELINE = 4


def pinger(sock: socket.socket) -> None:
    sent = 0
    for _ in range(PIPELINE):
        sent += 1
        sock.sendall(struct.pack("!Q", sent))
    want = 2
    while True:
        data = b""
        while len(data) < 8:
            data += sock.recv(8 - len(data))
        got = struct.unpack("!Q", data)[0]
        if got != want:
            os.write(2, f"pinger: got {got}, wanted {want}\n".encode())
            os._exit(3)
        want += 1
        sent += 1
        sock.sendall(struct.pack("!Q", sent))
        time.sleep(0.005)


def client() -> None:
    sock = socket.socket(socket.AF_UNIX)
    sock.connect("/tmp/srv.sock")
    n = 0
    while True:
        n += 1
        line = f"line {n}\n".encode()
        sock.sendall(line)
        echo = b""
        while not echo.endswith(b"\n"):
            echo += sock.recv(64)
        if echo != line:
            os._exit(4)
        time.sleep(0.02)


def fresh(family: int, address: object) -> int:
    """Whether a new connection to one of our listeners is accepted and echoed."""
    try:
        with socket.socket(family) as sock:
            sock.settimeout(5)
            sock.connect(address)
            sock.sendall(b"fresh\n")
            return int(sock.recv(64) == b"fresh\n")
    except OSError:
        return 0


def main() -> None:
    listeners = [socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX),
                 socket.create_server(("127.0.0.1", 8123))]
    listeners[0].bind("/tmp/srv.sock")
    listeners[1].bind("\0bunshin-treefork-sockets")
    for sock in listeners[:2]:
        sock.listen(8)
    ours, theirs = socket.socketpair()
    if os.fork() == 0:
        ours.close()
        pinger(theirs)
    theirs.close()
    if os.fork() == 0:
        client()
    sel = selectors.DefaultSelector()
    for sock in listeners:
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ, "listen")
    sel.register(ours, selectors.EVENT_READ, "ping")
    netlink = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)  # NETLINK_ROUTE
    netlink.bind((0, 1))  # RTMGRP_LINK
    netlink.setblocking(False)
    sel.register(netlink, selectors.EVENT_READ, "netlink")
    pings = echoes = bad = fresh_ok = links = 0
    buffered = b""
    last = 0.0
    tried = False
    conns: dict[socket.socket, bytes] = {}
    while True:
        for key, _ in sel.select(0.05):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            if key.data == "listen":
                conn, _ = sock.accept()
                conns[conn] = b""
                sel.register(conn, selectors.EVENT_READ, "conn")
            elif key.data == "ping":
                buffered += sock.recv(4096)
                while len(buffered) >= 8:
                    value = struct.unpack("!Q", buffered[:8])[0]
                    buffered = buffered[8:]
                    if value != pings + 1:
                        bad += 1
                    pings = value
                    sock.sendall(struct.pack("!Q", value + 1))
            elif key.data == "netlink":
                data = sock.recv(1 << 16)
                at = 0
                while at + 16 <= len(data):
                    length, kind = struct.unpack_from("=IH", data, at)
                    links += kind == 16  # RTM_NEWLINK
                    at += max(16, (length + 3) & ~3)
            else:
                data = sock.recv(4096)
                if not data:
                    sel.unregister(sock)
                    del conns[sock]
                    sock.close()
                    continue
                sock.sendall(data)
                echoes += data.count(b"\n")
        if os.path.exists("/tmp/go") and not tried:
            tried = True
            # RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, and an empty struct ifinfomsg
            netlink.send(struct.pack("=IHHII", 32, 18, 0x301, 1, 0) + bytes(16))
            # the fresh connections are served by this very loop: try them from a child
            if os.fork() == 0:
                ok = fresh(socket.AF_UNIX, "/tmp/srv.sock") + fresh(socket.AF_UNIX, "\0bunshin-treefork-sockets") + \
                    fresh(socket.AF_INET, ("127.0.0.1", 8123))
                with open("/tmp/fresh", "w") as f:
                    f.write(str(ok))
                os._exit(0)
        if os.path.exists("/tmp/fresh"):
            with open("/tmp/fresh") as f:
                fresh_ok = int(f.read() or 0)
        if time.monotonic() - last > 0.1:
            last = time.monotonic()
            with open("/tmp/sockets.out.new", "w") as f:
                f.write(f"pings {pings} echoes {echoes} bad {bad} fresh {fresh_ok} netlink {links}\n")
            os.rename("/tmp/sockets.out.new", "/tmp/sockets.out")
            with contextlib.suppress(ChildProcessError):
                os.waitpid(-1, os.WNOHANG)


main()

"""Framing on a workspace's Unix stream socket: a 4-byte big-endian length, then a MessagePack body.

Owns: reading and writing frames, with file descriptors passed as SCM_RIGHTS on a frame's first byte; the
blocking side (the workspace host, single-threaded) and the asyncio side (the engine).
Must never: interpret the messages (records.py types them).
"""

from __future__ import annotations

import array
import asyncio
import socket
import struct

from ..errors import EnvsError

MAX_FRAME = 256 << 20
MAX_FDS = 16  # descriptors one frame may carry
_HEADER = struct.Struct(">I")


class ChannelClosed(EnvsError, ConnectionError):
    """The other end went away (EOF or reset)."""


class FrameTooLarge(EnvsError, ValueError):
    pass


# -- blocking side (host) ----------------------------------------------------------------------------------------


def recv_frame(sock: socket.socket) -> tuple[bytes, list[int]]:
    """One frame and any descriptors that came with it. Raises ChannelClosed at EOF."""
    fds: list[int] = []
    header = bytearray()
    while len(header) < _HEADER.size:
        data, ancdata, _flags, _addr = sock.recvmsg(_HEADER.size - len(header), socket.CMSG_SPACE(4 * MAX_FDS))
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(array.array("i", payload[: len(payload) - len(payload) % 4]))
        if not data:
            raise ChannelClosed("engine closed the channel")
        header += data
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise FrameTooLarge(f"frame of {size} bytes")
    body = bytearray(size)
    view = memoryview(body)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ChannelClosed("engine closed the channel mid-frame")
        got += n
    return bytes(body), fds


def send_frame(sock: socket.socket, payload: bytes, fds: list[int] | None = None) -> None:
    data = _HEADER.pack(len(payload)) + payload
    if fds:
        sent = socket.send_fds(sock, [data], fds)  # the descriptors ride on the first byte
        data = data[sent:]
    if data:
        sock.sendall(data)


# -- asyncio side (engine) --------------------------------------------------------------------------------------


async def async_recv_frame(sock: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    header = await _recv_exactly(loop, sock, _HEADER.size)
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise FrameTooLarge(f"frame of {size} bytes")
    return await _recv_exactly(loop, sock, size)


async def _recv_exactly(loop: asyncio.AbstractEventLoop, sock: socket.socket, size: int) -> bytes:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        try:
            n = await loop.sock_recv_into(sock, view[got:])
        except ConnectionResetError as exc:
            raise ChannelClosed("workspace host reset the channel") from exc
        if n == 0:
            raise ChannelClosed("workspace host closed the channel")
        got += n
    return bytes(buf)


async def async_send_frame(sock: socket.socket, payload: bytes, fds: list[int] | None = None) -> None:
    loop = asyncio.get_running_loop()
    data = _HEADER.pack(len(payload)) + payload
    try:
        if fds:
            # The descriptors ride on the first byte; the rest may follow in ordinary sends.
            while True:
                try:
                    sent = socket.send_fds(sock, [data], fds)
                    break
                except BlockingIOError:
                    await asyncio.sleep(0.001)
            data = data[sent:]
        if data:
            await loop.sock_sendall(sock, data)
    except (BrokenPipeError, ConnectionResetError) as exc:
        raise ChannelClosed("workspace host closed the channel") from exc

"""One direction of a relayed TCP connection (the port forward's, the egress proxy's).

Owns: ``pump``: bytes from a reader to a writer until the reader's end, then an end-of-file to the writer.
Must never: raise for a connection the other side dropped (that ends the pump).
"""

from __future__ import annotations

import asyncio
import contextlib


async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while chunk := await source.read(1 << 16):
            sink.write(chunk)
            await sink.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        if sink.can_write_eof():
            with contextlib.suppress(OSError):
                sink.write_eof()

"""The application contract across a fork: files re-opened in the clone, sockets re-created in its network
namespace, state in the host's memory copied on write."""

from __future__ import annotations

import pytest

from bunshin.envs import AppSpec, ToolCall, WorkspaceRuntime
from tests.apps.notes import connect_and_send

pytestmark = pytest.mark.asyncio
NOTES = AppSpec(target="tests.apps.notes:NotesApp")


async def call(ws, name: str, **args) -> str:
    obs = await ws.execute(ToolCall(name=name, args=args))
    assert obs.error is None, obs
    return obs.output.strip()


async def test_open_files_are_reopened_in_the_clone(runtime: WorkspaceRuntime) -> None:
    source = await runtime.create(NOTES)
    await call(source, "append", text="shared")
    clone = await source.fork()
    await call(clone, "append", text="clone only")
    await call(source, "append", text="source only")
    # each side's journal (written through the file it kept open across the fork) holds its own history
    assert await call(clone, "shell", cmd="cat ~/journal.txt") == "shared\nclone only"
    assert await call(source, "shell", cmd="cat ~/journal.txt") == "shared\nsource only"
    assert await call(clone, "notes") == "shared\nclone only"


async def test_listening_sockets_are_recreated_in_the_clones_network(runtime: WorkspaceRuntime) -> None:
    source = await runtime.create(NOTES)
    clone = await source.fork()
    port = int(await call(source, "port"))
    assert int(await call(clone, "port")) == port  # the same port, in another network namespace
    assert await call(clone, "shell", cmd=connect_and_send(port, "to-clone")) == "sent"
    assert await call(source, "shell", cmd=connect_and_send(port, "to-source")) == "sent"
    assert await call(clone, "drain") == "to-clone"
    assert await call(source, "drain") == "to-source"
    grandchild = await clone.fork()
    assert await call(grandchild, "shell", cmd=connect_and_send(port, "deep")) == "sent"
    assert await call(grandchild, "drain") == "deep"
    assert await call(clone, "drain") == ""


async def test_a_snapshot_lets_go_of_its_source_and_its_clones_reopen(runtime: WorkspaceRuntime) -> None:
    source = await runtime.create(NOTES)
    await call(source, "append", text="before snapshot")
    snap = await source.snapshot()
    await call(source, "append", text="source after")
    await source.close()
    clone = await snap.fork()
    await call(clone, "append", text="clone")
    assert await call(clone, "shell", cmd="cat ~/journal.txt") == "before snapshot\nclone"
    port = int(await call(clone, "port"))
    assert await call(clone, "shell", cmd=connect_and_send(port, "hi")) == "sent"
    assert await call(clone, "drain") == "hi"

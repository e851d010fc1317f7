"""The host's side of the protocol: bad requests and bad tool calls are answered, never fatal."""

from __future__ import annotations

import msgspec
import pytest

from bunshin.envs import RequestRefused, ToolCall, WorkspaceRuntime
from bunshin.envs.runtime.channel import async_recv_frame, async_send_frame
from bunshin.envs.runtime.protocol import Failed, Pong, reply_decoder

from .conftest import heap_app, ping, pool_layers

pytestmark = pytest.mark.asyncio


async def raw_request(ws, payload: bytes):
    async with ws._lock:
        await async_send_frame(ws.sock, payload)
        return reply_decoder.decode(await async_recv_frame(ws.sock))


@pytest.mark.parametrize("payload", [
    b"\xc1",  # never valid MessagePack
    msgspec.msgpack.encode({"type": "format_disk"}),  # unknown message type
    msgspec.msgpack.encode({"type": "execute", "call": {"name": 7}}),  # wrong field type
    msgspec.msgpack.encode([1, 2, 3]),
])
async def test_message_the_host_does_not_understand_gets_a_typed_error(runtime: WorkspaceRuntime,
                                                                       payload: bytes) -> None:
    ws = await runtime.create(heap_app())
    reply = await raw_request(ws, payload)
    assert isinstance(reply, Failed) and reply.kind == "bad_request", reply
    pong = await ping(ws)
    assert isinstance(pong, Pong) and pong.pid == ws.pid


async def test_bad_tool_calls_give_observation_errors(runtime: WorkspaceRuntime) -> None:
    ws = await runtime.create(heap_app())
    cases = [
        (ToolCall(name="no_such_tool"), "unknown tool 'no_such_tool'"),
        (ToolCall(name="shell", args={}), "shell needs a string argument 'cmd'"),
        (ToolCall(name="shell", args={"cmd": "true", "bogus": 1}), "unknown arguments ['bogus']"),
        (ToolCall(name="write_pages", args={"fraction": 7}), "fraction must be in [0, 1]"),
        (ToolCall(name="read_page", args={}), "KeyError"),
    ]
    for call, message in cases:
        obs = await ws.execute(call)
        assert obs.error is not None and message in obs.error, (call, obs)
    assert (await ws.execute(ToolCall(name="shell", args={"cmd": "echo fine"}))).output == "fine\n"


async def test_command_timeout_is_reported_and_workspace_goes_on(runtime: WorkspaceRuntime) -> None:
    ws = await runtime.create(heap_app())
    obs = await ws.execute(ToolCall(name="shell", args={"cmd": "sleep 30 & echo started; sleep 30"}), timeout_s=1)
    assert obs.error == "command timed out after 1s" and obs.output == "started\n"
    assert (await ws.execute(ToolCall(name="shell", args={"cmd": "ps -e | grep -c sleep"}))).output == "0\n"


async def test_use_after_close_is_refused(runtime: WorkspaceRuntime) -> None:
    from bunshin.envs import WorkspaceClosed

    ws = await runtime.create(heap_app())
    await ws.close()
    await ws.close()  # twice is fine
    with pytest.raises(WorkspaceClosed):
        await ws.execute(ToolCall(name="shell", args={"cmd": "true"}))


async def test_bad_app_fails_start_with_its_error(runtime: WorkspaceRuntime) -> None:
    from bunshin.envs import AppSpec, WorkspaceStartFailed

    with pytest.raises(WorkspaceStartFailed, match="size_bytes must be >= 0"):
        await runtime.create(AppSpec(target="bunshin.envs.runtime.heap_app:HeapApp", kwargs={"size_bytes": -1}))
    with pytest.raises(WorkspaceStartFailed, match="No module named"):
        await runtime.create(AppSpec(target="no.such.module:App"))
    assert runtime.workspaces == {}
    assert pool_layers(runtime) == [image.lower for image in runtime.images.placed.values()]


async def test_snapshot_refuses_tools_through_the_host_too(runtime: WorkspaceRuntime) -> None:
    ws = await runtime.create(heap_app())
    snap = await ws.snapshot()
    from bunshin.envs.runtime.protocol import Execute

    with pytest.raises(RequestRefused, match="runs no tools"):
        await snap.request(Execute(call=ToolCall(name="shell", args={"cmd": "true"})))


async def test_agent_cannot_outwait_or_flood_the_host(runtime: WorkspaceRuntime) -> None:
    from bunshin.envs.runtime.agents import MAX_OUTPUT

    ws = await runtime.create(heap_app())
    flood = await ws.execute(ToolCall(name="shell", args={"cmd": "head -c 50000000 /dev/zero | tr '\\\\0' x"}))
    assert flood.exit_code == 0 and len(flood.output) == MAX_OUTPUT
    capped = await ws.execute(ToolCall(name="shell", args={"cmd": "sleep 5", "timeout_s": 3600}), timeout_s=1)
    assert capped.error == "command timed out after 1s"
    bad = await ws.execute(ToolCall(name="shell", args={"cmd": "true", "timeout_s": float("inf")}))
    assert bad.error is not None and "timeout_s must be a positive number" in bad.error

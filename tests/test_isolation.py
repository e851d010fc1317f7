"""What an agent command inside a workspace can and cannot do, and what a workspace's limits stop."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

from bunshin.envs import Limits, ToolCall, Workspace, WorkspaceBroken, WorkspaceRuntime

from .conftest import heap_app

pytestmark = pytest.mark.asyncio


def sh(cmd: str, timeout_s: float | None = None) -> ToolCall:
    args: dict[str, object] = {"cmd": cmd}
    if timeout_s is not None:
        args["timeout_s"] = timeout_s
    return ToolCall(name="shell", args=args)


async def run(ws: Workspace, cmd: str) -> tuple[int | None, str]:
    obs = await ws.execute(sh(cmd))
    return obs.exit_code, obs.output.strip()


async def test_agent_cannot_reach_host_files(runtime: WorkspaceRuntime, tmp_path: Path) -> None:
    secret = Path("/root/bunshin-test-secret")
    secret.write_text("host secret\n")
    try:
        ws = await runtime.create(heap_app())
        for path in (str(secret), str(Path.cwd() / "README.md"), str(Path(__file__))):
            code, text = await run(ws, f"cat {path} 2>&1")
            assert code != 0 and "host secret" not in text, f"agent could read {path}: {text}"
        for path in (str(runtime.run_dir), str(runtime.layers.root), "/var/lib", "/root", str(Path.cwd()),
                     str(Path.cwd() / ".venv")):
            code, text = await run(ws, f"ls -A {path} 2>&1")
            assert code != 0, f"agent could list {path}: {text}"
        code, text = await run(ws, f"echo pwned > {secret} 2>&1; echo pwned > /root/x 2>&1")
        assert code != 0
        assert secret.read_text() == "host secret\n"
        # what it sees of /usr is the image, read-only; the image's /etc cannot be modified
        code, text = await run(ws, "touch /usr/bin/evil 2>&1; echo x >> /etc/passwd 2>&1; id -u")
        assert "Read-only file system" in text and "Permission denied" in text
        assert text.endswith("65000")
        assert not Path("/usr/bin/evil").exists()
        assert (runtime.layers.root / runtime.image.lower / "etc/passwd").read_text().count("\n") == 3
    finally:
        secret.unlink()


async def test_agent_sees_only_its_own_processes(runtime: WorkspaceRuntime) -> None:
    one = await runtime.create(heap_app())
    two = await runtime.create(heap_app())
    await two.execute(sh("sleep 300 > /dev/null 2>&1 &"))
    code, text = await run(one, "ps -eo pid,user,args")
    assert "sleep 300" not in text and "pytest" not in text
    assert len(text.splitlines()) <= 5, text  # header, init, sh, ps
    code, text = await run(one, f"kill -0 {os.getpid()} 2>&1; kill -9 {two.pid} 2>&1; echo done")
    assert text.endswith("done") and "No such process" in text
    assert (await two.ping()).pid == two.pid


async def test_agent_network_is_loopback_only(runtime: WorkspaceRuntime) -> None:
    with socket.socket() as server:  # a server on the host's loopback: a workspace must not reach it
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        ws = await runtime.create(heap_app())
        code, text = await run(ws, "ip -o link; ip route; ip -6 route")
        assert text.splitlines()[0].split()[1] == "lo:" and len(text.splitlines()) == 1 + text.count("::1")
        probe = ("import socket,sys\n"
                 "for host, port in (('127.0.0.1', %d), ('10.0.0.1', 80), ('8.8.8.8', 53)):\n"
                 "    s = socket.socket(); s.settimeout(2)\n"
                 "    try: s.connect((host, port)); print('connected', host)\n"
                 "    except OSError as e: print('refused', host, e.errno)\n") % port
        code, text = await run(ws, f"python3 -c \"{probe}\"")
        assert "connected" not in text, text
        assert text.count("refused") == 3
        # its own loopback works
        code, text = await run(ws, "python3 -c \"import socket; s=socket.socket(); s.bind(('127.0.0.1', 8080)); "
                                   "s.listen(); c=socket.create_connection(('127.0.0.1', 8080)); print('self ok')\"")
        assert text == "self ok"


async def test_hostname_is_the_workspaces_own(runtime: WorkspaceRuntime) -> None:
    ws = await runtime.create(heap_app())
    clone = await ws.fork()
    assert (await run(ws, "hostname"))[1] == f"ws-{ws.id}"
    assert (await run(clone, "hostname"))[1] == f"ws-{clone.id}"
    assert socket.gethostname() not in {f"ws-{ws.id}", f"ws-{clone.id}"}


async def test_fork_bomb_breaks_only_its_workspace(make_runtime) -> None:
    rt = await make_runtime(limits=Limits(memory_bytes=1 << 30, pids=64, command_timeout_s=5))
    bystander = await rt.create(heap_app())
    bomb = await rt.create(heap_app())
    with pytest.raises(WorkspaceBroken) as info:
        await bomb.execute(sh("bomb() { bomb | bomb & }; bomb", timeout_s=3))
    assert "process limit" in info.value.reason
    with pytest.raises(WorkspaceBroken):
        await bomb.execute(sh("true"))
    assert (await run(bystander, "echo alive"))[1] == "alive"
    await bomb.close()
    assert (await run(bystander, "echo still alive"))[1] == "still alive"


async def test_memory_hog_breaks_only_its_workspace(make_runtime) -> None:
    rt = await make_runtime(limits=Limits(memory_bytes=160 << 20, pids=128, command_timeout_s=20))
    bystander = await rt.create(heap_app())
    hog = await rt.create(heap_app())
    with pytest.raises(WorkspaceBroken) as info:
        await hog.execute(sh("python3 -c \"x = bytearray(400 << 20); print('survived')\""))
    assert "memory limit" in info.value.reason
    assert (await run(bystander, "echo alive"))[1] == "alive"


async def test_dead_host_is_reported_with_its_reason(runtime: WorkspaceRuntime) -> None:
    import signal

    victim = await runtime.create(heap_app())
    other = await runtime.create(heap_app())
    os.kill(victim.pid, signal.SIGKILL)
    with pytest.raises(WorkspaceBroken) as info:
        await victim.execute(sh("true"))
    assert "killed by SIGKILL" in info.value.reason
    assert (await run(other, "echo ok"))[1] == "ok"
    await asyncio.sleep(0)

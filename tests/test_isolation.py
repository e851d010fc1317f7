"""What an agent command inside a workspace can and cannot do, and what a workspace's limits stop."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from bunshin.envs import Limits, ToolCall, Workspace, WorkspaceBroken, WorkspaceRuntime

from .conftest import heap_app, ping

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
        assert (runtime.layers.root / runtime.images.placed["host"].lower / "etc/passwd").read_text().count("\n") == 3
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
    assert (await ping(two)).pid == two.pid


async def test_agent_network_is_loopback_only(runtime: WorkspaceRuntime) -> None:
    with socket.socket() as server:  # a server on the host's loopback: a workspace must not reach it
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        ws = await runtime.create(heap_app())
        code, text = await run(ws, "ip -o link; ip route; ip -6 route")
        assert text.splitlines()[0].split()[1] == "lo:" and len(text.splitlines()) == 1 + text.count("::1")
        probe = ("import socket,sys\n"
                 f"for host, port in (('127.0.0.1', {port}), ('10.0.0.1', 80), ('8.8.8.8', 53)):\n"
                 "    s = socket.socket(); s.settimeout(2)\n"
                 "    try: s.connect((host, port)); print('connected', host)\n"
                 "    except OSError as e: print('refused', host, e.errno)\n")
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


async def test_the_runtimes_own_files_are_out_of_the_agents_reach(runtime: WorkspaceRuntime) -> None:
    """The host's interpreter and bunshin's sources are bound into every workspace (below a root-only directory,
    reached by symlinks): an agent can neither read, list, write nor import them."""
    import sys

    from bunshin.envs.runtime.rootfs import RUNTIME_DIR

    ws = await runtime.create(heap_app())
    code, text = await run(ws, f"ls {RUNTIME_DIR} 2>&1; cat {RUNTIME_DIR}{sys.prefix}/pyvenv.cfg 2>&1")
    assert text.count("Permission denied") == 2, text
    binds = runtime.hosts.run.runtime_binds
    assert any(sys.prefix == b or sys.prefix.startswith(b + "/") for b in binds)
    for bind in binds:  # each is a link the agent cannot follow (or below a directory it cannot enter: /root)
        code, text = await run(ws, f"readlink {bind} || ls {os.path.dirname(bind)} 2>&1")
        assert text == f"{RUNTIME_DIR}{bind}" or "Permission denied" in text, (bind, text)
    code, text = await run(ws, f"cat {sys.prefix}/pyvenv.cfg 2>&1; touch {sys.prefix}/x 2>&1; ls {sys.prefix} 2>&1")
    assert text.count("Permission denied") == 3, text
    code, text = await run(ws, f"PYTHONPATH={Path(__file__).parent.parent} python3 -c 'import bunshin.envs' 2>&1")
    assert code != 0 and "ModuleNotFoundError" in text


async def test_dev_shm_is_the_workspaces_own_and_bounded(runtime: WorkspaceRuntime) -> None:
    one, two = await runtime.create(heap_app()), await runtime.create(heap_app())
    assert (await run(one, "echo secret > /dev/shm/probe && cat /dev/shm/probe"))[1] == "secret"
    assert (await run(two, "cat /dev/shm/probe 2>&1"))[0] != 0
    assert not Path("/dev/shm/probe").exists()
    clone = await one.fork()  # a clone starts with a /dev/shm of its own, not its source's
    assert (await run(clone, "ls -A /dev/shm"))[1] == ""
    code, text = await run(one, "head -c 100M /dev/zero > /dev/shm/big; echo status $?; du -m /dev/shm/big")
    assert "No space left on device" in text and "status 1" in text and int(text.split()[-2]) <= 64, text


async def test_sysv_ipc_objects_stay_in_their_workspace(runtime: WorkspaceRuntime) -> None:
    one, two = await runtime.create(heap_app()), await runtime.create(heap_app())
    code, text = await run(one, "ipcmk -M 4096 && ipcmk -Q && ipcs -m -q")
    assert code == 0 and "Shared memory id" in text
    key_lines = [line for line in text.splitlines() if line.startswith("0x")]
    assert len(key_lines) == 2, text  # one segment, one queue, visible here
    code, text = await run(two, "ipcs -m -q")
    assert not [line for line in text.splitlines() if line.startswith("0x")], text
    host = subprocess.run(["ipcs", "-m", "-q"], capture_output=True, text=True).stdout
    assert not {line.split()[1] for line in key_lines} & {line.split()[1] for line in host.splitlines()
                                                          if line.startswith("0x")}


async def test_abstract_unix_sockets_stay_in_their_workspace(runtime: WorkspaceRuntime) -> None:
    """Abstract socket names live in the network namespace: another workspace (or the host) cannot reach them."""
    one, two = await runtime.create(heap_app()), await runtime.create(heap_app())
    # the listener forks once it listens and its parent exits: the command returns with the socket bound
    listen = ("nohup python3 -c \"import os, socket, time; s = socket.socket(socket.AF_UNIX); "
              "s.bind('\\0bunshin-probe'); s.listen(); os.fork() and os._exit(0); time.sleep(60)\" > /dev/null 2>&1")
    connect = ("python3 -c \"import socket; s = socket.socket(socket.AF_UNIX)\n"
               "try:\n    s.connect('\\0bunshin-probe'); print('connected')\n"
               "except OSError as e: print('refused', e.errno)\"")
    await run(one, listen)
    assert (await run(one, connect))[1] == "connected"
    assert (await run(two, connect))[1].startswith("refused")
    with socket.socket(socket.AF_UNIX) as s, pytest.raises(OSError):
        s.connect("\0bunshin-probe")

"""``--runtime docker``: workspaces as Docker containers on a real daemon (``envs/runtime/docker_hosts.py``,
``fork/docker.py``). The escape probes of our own runtime, run inside a container; a batch's rollouts equal to the
native runtime's on both embedded suites; and the failures: no daemon, an image the daemon lacks, a container killed
in the middle of a rollout, an engine killed with its containers running. Every test checks that no container,
committed image, cgroup or process of its run is left. The workspace contract itself runs on this runtime too
(``test_workspace_contract.py``, its ``docker`` parameter)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from pathlib import Path

import pytest

from bunshin.engine.records import Status
from bunshin.engine.rollout import RolloutEngine
from bunshin.envs import AppSpec, Limits, ToolCall, Workspace, WorkspaceBroken, WorkspaceRuntime
from bunshin.envs.images.docker_roots import DockerImageMissing, DockerUnavailable, docker_client
from bunshin.envs.runtime.docker_hosts import LABEL
from bunshin.envs.runtime.rootfs import RUNTIME_DIR
from bunshin.envs.suites.registry import get_suite
from bunshin.policies.scripted import ScriptedPolicy

from .conftest import assert_no_leaks, heap_app, leftovers
from .quiet import settled
from .test_docker_images import comparable

pytestmark = pytest.mark.asyncio


async def sh(ws: Workspace, cmd: str, timeout_s: float | None = None) -> tuple[int | None, str]:
    args: dict[str, object] = {"cmd": cmd}
    if timeout_s is not None:
        args["timeout_s"] = timeout_s
    obs = await ws.execute(ToolCall(name="shell", args=args))
    return obs.exit_code, obs.output.strip()


async def labelled(address: str, run_id: str | None = None) -> list[str]:
    """Containers and images labelled with ``run_id`` (None: with any run)."""
    label = LABEL if run_id is None else f"{LABEL}={run_id}"
    async with docker_client(address) as client:
        containers = await client.containers.list(all=True, filters={"label": [label]})
        images = await client.images.list(filters={"label": [label]})
    return [f"container {c.id[:12]}" for c in containers] + [f"image {i['Id'][7:19]}" for i in images]


async def test_the_escape_probes_pass_inside_a_container(make_runtime, docker_daemon: str,
                                                         base_docker_ref: str) -> None:
    secret = Path("/root/bunshin-docker-secret")
    secret.write_text("host secret\n")
    rt = await make_runtime(runtime="docker", image=base_docker_ref)
    try:
        ws = await rt.create(heap_app(1 << 20))
        # no capabilities, the agent's uid, no new privileges
        code, text = await sh(ws, "id -u; grep -E '^(CapInh|CapPrm|CapEff|CapAmb|NoNewPrivs)' /proc/self/status")
        assert text.split("\n")[0] == "65000"
        assert [line.split()[1] for line in text.split("\n")[1:]] == ["0000000000000000"] * 4 + ["1"], text
        code, text = await sh(ws, "kill -9 1 2>&1; echo status $?")
        assert "status 1" in text or "Operation not permitted" in text
        # no network but its own loopback
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen()
            probe = ("import socket\n"
                     f"for host, port in (('127.0.0.1', {server.getsockname()[1]}), ('10.0.0.1', 80), "
                     "('8.8.8.8', 53), ('172.17.0.1', 2375)):\n"
                     "    s = socket.socket(); s.settimeout(2)\n"
                     "    try: s.connect((host, port)); print('connected', host)\n"
                     "    except OSError as e: print('refused', host, e.errno)\n")
            code, text = await sh(ws, f"python3 -c \"{probe}\"; cat /proc/net/dev")
        assert "connected" not in text and text.count("refused") == 4, text
        assert [line.split(":")[0].strip() for line in text.splitlines() if ":" in line and "|" not in line] == ["lo"]
        # no Docker socket, no host paths, the runtime's own files out of reach
        code, text = await sh(ws, "ls -A /var/run/docker.sock /run/docker.sock /run/containerd /var/lib/docker "
                                  f"{rt.run_dir} 2>&1")
        assert text.count("No such file or directory") == 5, text
        code, text = await sh(ws, f"cat {secret} 2>&1; ls -A {Path.cwd()} 2>&1; ls {RUNTIME_DIR} /.bunshin-pool 2>&1; "
                                  f"cat {RUNTIME_DIR}{sys.prefix}/pyvenv.cfg 2>&1")
        assert "host secret" not in text and text.count("Permission denied") == 5, text
        code, text = await sh(ws, f"PYTHONPATH={Path(__file__).parent.parent} python3 -c 'import bunshin.envs' 2>&1")
        assert code != 0 and "ModuleNotFoundError" in text
        code, text = await sh(ws, "echo pwned > /root/x 2>&1; touch /usr/bin/evil 2>&1; echo done")
        assert text.count("Permission denied") == 2 and text.endswith("done"), text
        # its own processes only: its host (pid 1), the shell, what it ran
        code, text = await sh(ws, "ls /proc | grep -E '^[0-9]+$' | sort -n | head -1; "
                                  "ls /proc | grep -cE '^[0-9]+$'")
        assert text.split() [0] == "1" and int(text.split()[1]) <= 5, text
        assert secret.read_text() == "host secret\n"
    finally:
        secret.unlink()


async def test_limits_and_deadlines_hold_in_a_container(make_runtime, base_docker_ref: str) -> None:
    rt = await make_runtime(runtime="docker", image=base_docker_ref,
                            limits=Limits(memory_bytes=256 << 20, pids=64, command_timeout_s=5))
    bystander, bomb, hog = [await rt.create(heap_app(1 << 20)) for _ in range(3)]
    with pytest.raises(WorkspaceBroken, match="process limit"):
        await bomb.execute(ToolCall(name="shell", args={"cmd": "bomb() { bomb | bomb & }; bomb", "timeout_s": 3}))
    with pytest.raises(WorkspaceBroken, match="memory limit"):
        await sh(hog, "python3 -c \"x = bytearray(600 << 20); print('survived')\"")
    assert await sh(bystander, "sleep 30; echo late", timeout_s=0.5) == (-9, "")
    assert await sh(bystander, "echo alive") == (0, "alive")
    await bomb.close()
    await hog.close()


async def test_a_daemon_down_or_an_image_missing_is_a_typed_error(make_runtime, state_dir: Path,
                                                                 docker_daemon: str) -> None:
    with pytest.raises(DockerUnavailable, match="no Docker daemon answers at unix:///nonexistent"):
        await make_runtime(runtime="docker", docker_address="unix:///nonexistent/docker.sock")
    rt = await make_runtime(runtime="docker", image="docker:bunshin/no-such-image:0")
    with pytest.raises(Exception) as caught:
        await rt.create(heap_app(1 << 20))
    assert isinstance(caught.value, DockerImageMissing) or "no-such-image" in str(caught.value)
    with pytest.raises(ValueError, match="Docker image"):
        WorkspaceRuntime(runtime="docker", image=str(state_dir), state_dir=state_dir)


async def batch(suite_name: str, state_dir: Path, runtime_kind: str, **kwargs: object) -> list:
    suite = get_suite(suite_name, time_scale=0.0)
    engine = RolloutEngine(suite, ScriptedPolicy(time_scale=0.0), concurrency=4, state_dir=state_dir,
                           runtime_kind=runtime_kind, **kwargs)  # type: ignore[arg-type]
    async with engine:
        tasks = sorted(engine.tasks)[:3]
        results = await engine.run(engine.requests(tasks, group_size=3, seed=5))
    await assert_no_leaks(engine.runtime)
    return [r.trajectory for r in results]


@pytest.mark.parametrize("suite_name", ["webshop", "desktop"])
async def test_a_batch_under_the_docker_runtime_gives_the_native_runtimes_rollouts(
        suite_name: str, state_dir: Path, docker_daemon: str, base_docker_ref: str, loop_watchdog: None) -> None:
    native = await batch(suite_name, state_dir, "native")
    docker = await batch(suite_name, state_dir, "docker")
    assert len(docker) == 9 and all(t.status == Status.OK and t.backend == "docker" for t in docker)
    assert [comparable(t) | {"backend": ""} for t in docker] == [comparable(t) | {"backend": ""} for t in native]
    assert await labelled(docker_daemon, None) == []


async def test_a_container_killed_mid_rollout_fails_its_rollout_and_the_batch_goes_on(
        state_dir: Path, docker_daemon: str, base_docker_ref: str, loop_watchdog: None) -> None:
    suite = get_suite("webshop", time_scale=0.0)
    engine = RolloutEngine(suite, ScriptedPolicy(time_scale=1.0, fail_p=0.0, detour_p=0.0), concurrency=4,
                           state_dir=state_dir, runtime_kind="docker")
    killed: list[str] = []

    async def kill_one() -> None:
        """A second after a sample's workspace (a fork of its group's base, itself a fork of the app's root) is up,
        its container, killed through the daemon (the policy takes seconds a step: the rollout is under way)."""
        async with docker_client(docker_daemon) as client:
            while not killed:
                await asyncio.sleep(0.2)
                samples = [ws for ws in engine.runtime.workspaces.values() if ws.generation >= 2 and not ws.frozen]
                if samples:
                    await asyncio.sleep(1.0)
                    if samples[0].closed:
                        continue
                    await client.containers.container(samples[0].container_id).kill()
                    killed.append(samples[0].id)

    async with engine:
        tasks = sorted(engine.tasks)[:2]
        killer = asyncio.ensure_future(kill_one())
        try:
            results = await engine.run(engine.requests(tasks, group_size=3, seed=5))
        finally:
            killer.cancel()
    trajectories = [r.trajectory for r in results]
    assert killed and len(trajectories) == 6
    failed = [t for t in trajectories if t.status != Status.OK]
    assert len(failed) == 1 and failed[0].status == Status.WORKSPACE_FAILED, [(t.status, t.error) for t in failed]
    assert "host killed by SIGKILL" in (failed[0].error or "")
    await assert_no_leaks(engine.runtime)
    assert await labelled(docker_daemon, engine.runtime.run_id) == []


ENGINE = """
import asyncio, sys
from bunshin.envs import WorkspaceRuntime, AppSpec, ToolCall
async def main():
    rt = WorkspaceRuntime(runtime="docker", image=sys.argv[1], state_dir=sys.argv[2])
    await rt.start()
    ws = await rt.create(AppSpec(target="bunshin.envs.runtime.heap_app:HeapApp", kwargs={"size_bytes": 1 << 20}))
    await ws.execute(ToolCall(name="shell", args={"cmd": "echo x > /tmp/x"}))
    await ws.fork()
    print(rt.run_id, flush=True)
    await asyncio.sleep(600)
asyncio.run(main())
"""


async def test_a_killed_engines_containers_and_images_are_removed_at_the_next_start(
        state_dir: Path, docker_daemon: str, base_docker_ref: str) -> None:
    engine = await asyncio.create_subprocess_exec(sys.executable, "-c", ENGINE, base_docker_ref, str(state_dir),
                                                  stdout=asyncio.subprocess.PIPE)
    try:
        assert engine.stdout is not None
        run_id = (await asyncio.wait_for(engine.stdout.readline(), 120)).decode().strip()
        assert run_id, "the engine did not start"
        assert len([x for x in await labelled(docker_daemon, run_id) if x.startswith("container")]) == 2
    finally:
        engine.send_signal(signal.SIGKILL)
        await engine.wait()
    assert await labelled(docker_daemon, run_id)  # its containers (the hosts ended) and its fork's image
    rt = WorkspaceRuntime(runtime="docker", image=base_docker_ref, state_dir=state_dir)
    await rt.start()  # what removes a dead run's remains
    await rt.close()
    assert await labelled(docker_daemon, run_id) == []
    assert await settled(lambda: leftovers(run_id, state_dir / "runs" / run_id), 10.0) == []
    assert not any(p.name.endswith(run_id) for p in Path("/sys/fs/cgroup/memory").glob("bunshin-*"))
    assert os.path.exists(docker_daemon.removeprefix("unix://"))


async def test_an_app_without_an_image_is_refused_by_name(make_runtime, docker_daemon: str) -> None:
    rt = await make_runtime(runtime="docker")
    with pytest.raises(Exception, match="needs an image"):
        await rt.create(AppSpec(target="bunshin.envs.runtime.heap_app:HeapApp", kwargs={"size_bytes": 1 << 20}))


async def test_a_batch_on_a_missing_image_ends_every_rollout_with_a_typed_status(
        state_dir: Path, docker_daemon: str, loop_watchdog: None) -> None:
    trajectories = await batch("webshop", state_dir, "docker", image="docker:bunshin/no-such-image:0")
    assert len(trajectories) == 9
    assert {t.status for t in trajectories} == {Status.SETUP_FAILED}
    assert all("'bunshin/no-such-image:0' is not on this daemon" in (t.error or "") for t in trajectories)



async def test_a_dead_runs_groups_left_only_in_hierarchies_we_do_not_use_are_removed(state_dir: Path) -> None:
    from bunshin.envs.runtime.cleanup import remove_stale_runs

    others = [p for p in Path("/sys/fs/cgroup").iterdir() if p.is_dir() and p.name in ("unified", "blkio", "devices")]
    assert others, "no other hierarchy mounted here"
    left = [root / "bunshin-19990101000000-dead00" for root in others]
    for group in left:
        (group / "0123abcd").mkdir(parents=True)  # as Docker leaves a container's parent and the container's own
    remove_stale_runs(state_dir)
    assert [g for g in left if g.exists()] == []

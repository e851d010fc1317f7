"""Docker images as workspace roots (``envs/images/docker_roots.py``): a local image's files taken once per image id
through a real daemon, workspaces on it forking live and giving the same rollouts as on the native image, its Env and
WorkingDir for agent commands, and the failures: no daemon, no such image, an image the host cannot run on, a full
disk while extracting, and what a killed extraction left, all typed and leaving nothing behind."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

import msgspec
import pytest

from bunshin.engine.records import Trajectory
from bunshin.engine.rollout import RolloutEngine
from bunshin.envs import AppSpec, ToolCall, Workspace
from bunshin.envs.images.docker_daemon import answers, declared_ref
from bunshin.envs.images.docker_roots import (
    EXPORT_LABEL,
    DockerImageMissing,
    DockerImportFailed,
    DockerRef,
    DockerRoots,
    DockerUnavailable,
    docker_client,
    import_root,
)
from bunshin.envs.images.recipes import recipe
from bunshin.envs.images.store import ImageStore
from bunshin.envs.runtime.image import ImageError
from bunshin.envs.suites.registry import get_suite
from bunshin.policies.scripted import ScriptedPolicy

from .conftest import assert_no_leaks, heap_app

NO_DAEMON = "unix:///nonexistent/docker.sock"


async def sh(ws: Workspace, cmd: str) -> tuple[int | None, str]:
    obs = await ws.execute(ToolCall(name="shell", args={"cmd": cmd}))
    return obs.exit_code, obs.output.strip()


async def export_containers(address: str) -> list[str]:
    async with docker_client(address) as client:
        return [c.id for c in await client.containers.list(all=True, filters={"label": [EXPORT_LABEL]})]


def comparable(t: Trajectory) -> dict:
    """A trajectory without its timings and workspace ids (wall-clock, random names)."""
    data = msgspec.to_builtins(t)
    for key in ("timings", "lineage"):
        data.pop(key)
    for step in data["steps"]:
        step.pop("tool_s")
    return data


# -- the cache ----------------------------------------------------------------------------------------------------------


def test_a_docker_reference_is_parsed_or_refused_by_name() -> None:
    assert DockerRef.parse("docker:bunshin/base:abc").name == "bunshin/base:abc"
    assert str(DockerRef.parse("docker:alpine")) == "docker:alpine"
    for bad in ("docker:", "docker:  ", "alpine", "docker:a b"):
        with pytest.raises(ValueError, match="Docker image reference"):
            DockerRef.parse(bad)


@pytest.mark.asyncio
async def test_an_image_is_extracted_once_per_id_with_the_files_of_the_native_root(
        base_docker_ref: str, docker_daemon: str, tmp_path: Path) -> None:
    roots = DockerRoots(tmp_path / "cache", docker_daemon)
    lines: list[str] = []
    first = await roots.get(DockerRef.parse(base_docker_ref), progress=lines.append)
    assert any("MiB extracted" in line for line in lines)
    native = ImageStore().require(recipe("base")).root
    for rel in ("usr/bin/python3.11", "etc/os-release", "usr/lib/python3.11/os.py"):
        assert (first.root / rel).read_bytes() == (native / rel).read_bytes()
    assert (first.root / "etc/passwd").stat().st_uid == 0
    told = len(lines)
    again = await roots.get(DockerRef.parse(base_docker_ref), progress=lines.append)
    assert again == first and len(lines) == told  # found in the cache: no second extraction
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")] == [first.image_id]
    assert await export_containers(docker_daemon) == []


@pytest.mark.asyncio
async def test_no_daemon_and_a_missing_image_are_typed_errors(base_docker_ref: str, docker_daemon: str,
                                                              tmp_path: Path) -> None:
    with pytest.raises(DockerUnavailable, match="no Docker daemon answers at unix:///nonexistent"):
        await DockerRoots(tmp_path, NO_DAEMON).get(DockerRef.parse(base_docker_ref))
    with pytest.raises(DockerImageMissing, match="'bunshin/no-such-image:0' is not on this daemon"):
        await DockerRoots(tmp_path, docker_daemon).get(DockerRef("bunshin/no-such-image:0"))
    assert not answers(NO_DAEMON) and answers(docker_daemon)


@pytest.mark.asyncio
async def test_a_full_disk_while_extracting_is_a_typed_error_that_leaves_nothing(
        base_docker_ref: str, docker_daemon: str, tmp_path: Path) -> None:
    cache = tmp_path / "small"
    cache.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(cache)], check=True)
    try:
        with pytest.raises(DockerImportFailed, match="No space left on device") as caught:
            await DockerRoots(cache, docker_daemon).get(DockerRef.parse(base_docker_ref))
        assert base_docker_ref in str(caught.value)
        assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []
        assert await export_containers(docker_daemon) == []
    finally:
        subprocess.run(["umount", str(cache)], check=True)


@pytest.mark.asyncio
async def test_a_cancelled_extraction_leaves_nothing(base_docker_ref: str, docker_daemon: str,
                                                     tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    for delay in (0.1, 0.3, 0.6):
        task = asyncio.ensure_future(DockerRoots(cache, docker_daemon).get(DockerRef.parse(base_docker_ref)))
        await asyncio.sleep(delay)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        left = [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] if cache.exists() else []
        assert left == [], f"cancelled after {delay} s"
        assert await export_containers(docker_daemon) == []


@pytest.mark.asyncio
async def test_what_a_killed_extraction_left_is_removed_by_the_next(base_docker_ref: str, docker_daemon: str,
                                                                   tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    async with docker_client(docker_daemon) as client:
        image_id = str((await client.images.inspect(DockerRef.parse(base_docker_ref).name))["Id"])
        left = await client.containers.create({"Image": image_id, "Entrypoint": ["/"], "Cmd": [],
                                               "Labels": {EXPORT_LABEL: str(dead.pid)}})
    cache = tmp_path / "cache"
    partial = cache / f"{image_id.removeprefix('sha256:')}.partial-{dead.pid}"
    (partial / "root" / "etc").mkdir(parents=True)
    found = await DockerRoots(cache, docker_daemon).get(DockerRef.parse(base_docker_ref))
    assert not partial.exists() and found.root.is_dir()
    assert left.id not in await export_containers(docker_daemon)


# -- workspaces on an imported image --------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_workspace_on_a_docker_image_forks_live_and_takes_its_env_and_workdir(
        make_runtime, docker_daemon: str) -> None:
    built = ImageStore().require(recipe("base"))
    await import_root(built.root, "bunshin-test/configured", "1", address=docker_daemon,
                      changes=("ENV GREETING=from-the-image", "ENV HOME=/root", "WORKDIR /srv"))
    rt = await make_runtime(image="docker:bunshin-test/configured:1")
    ws = await rt.create(heap_app(1 << 20))
    assert await sh(ws, 'echo "$GREETING $HOME $USER"; pwd; id -u') == (0, "from-the-image /home/agent agent\n/srv\n"
                                                                             "65000")
    assert await sh(ws, "ls /var/run/docker.sock /run/docker.sock 2>&1; echo files > /srv/x 2>&1; echo done") == (
        0, "ls: cannot access '/var/run/docker.sock': No such file or directory\n"
           "ls: cannot access '/run/docker.sock': No such file or directory\n"
           "/bin/sh: 1: cannot create /srv/x: Permission denied\ndone")
    assert await sh(ws, "echo mine > /tmp/mark") == (0, "")
    clone = await ws.fork()
    assert await sh(clone, 'cat /tmp/mark; echo "$GREETING"; pwd') == (0, "mine\nfrom-the-image\n/srv")
    await clone.close()
    await ws.close()


@pytest.mark.asyncio
async def test_an_image_without_a_shell_is_refused_by_name(make_runtime, docker_daemon: str,
                                                                    tmp_path: Path) -> None:
    root = tmp_path / "tiny"
    (root / "bin").mkdir(parents=True)
    shutil.copy2("/bin/true", root / "bin" / "true")
    await import_root(root, "bunshin-test/no-python", "1", address=docker_daemon)
    rt = await make_runtime()
    with pytest.raises(ImageError, match=r"docker:bunshin-test/no-python:1: the image lacks /bin/sh \(agent"):
        await rt.create(AppSpec(target="bunshin.envs.runtime.heap_app:HeapApp", kwargs={"size_bytes": 1 << 20},
                                image="docker:bunshin-test/no-python:1"))
    ws = await rt.create(heap_app(1 << 20))  # the run goes on
    assert (await sh(ws, "echo ok")) == (0, "ok")
    await ws.close()


@pytest.mark.asyncio
async def test_a_runtime_without_a_daemon_or_image_fails_at_its_start_and_leaves_nothing(make_runtime,
                                                                                       docker_daemon: str) -> None:
    with pytest.raises(DockerImageMissing, match="bunshin/no-such-image:0"):
        await make_runtime(image="docker:bunshin/no-such-image:0")
    with pytest.raises(DockerUnavailable):
        await make_runtime(image="docker:bunshin/base:0", docker_roots=DockerRoots(address=NO_DAEMON))


async def batch(suite_name: str, state_dir: Path, image: str | None) -> list[Trajectory]:
    suite = get_suite(suite_name, time_scale=0.0)
    engine = RolloutEngine(suite, ScriptedPolicy(time_scale=0.0), concurrency=4, state_dir=state_dir, image=image)
    async with engine:
        tasks = sorted(engine.tasks)[:3]
        results = await engine.run(engine.requests(tasks, group_size=3, seed=5))
    await assert_no_leaks(engine.runtime)
    return [r.trajectory for r in results]


@pytest.mark.asyncio
@pytest.mark.parametrize("suite_name", ["webshop", "desktop"])
async def test_a_batch_on_the_imported_image_gives_the_native_images_rollouts(suite_name: str, state_dir: Path,
                                                                            base_docker_ref: str,
                                                                            loop_watchdog: None) -> None:
    native = await batch(suite_name, state_dir, None)
    docker = await batch(suite_name, state_dir, base_docker_ref)
    assert len(native) == 9 and all(t.status.value == "ok" for t in native)
    assert [comparable(t) for t in docker] == [comparable(t) for t in native]
    assert declared_ref(ImageStore().require(recipe("base"))) == DockerRef.parse(base_docker_ref)


def test_the_test_daemon_is_the_one_the_session_uses(docker_daemon: str) -> None:
    assert answers(docker_daemon)
    assert os.path.exists(docker_daemon.removeprefix("unix://"))
    assert asyncio.run(export_containers(docker_daemon)) == []

"""A workspace can run on an image directory or tarball instead of the host-derived default."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bunshin.envs import ToolCall, WorkspaceRuntime

from .conftest import heap_app
from .rootfs_builder import build_minimal_rootfs

pytestmark = pytest.mark.asyncio


async def sh(ws, cmd: str) -> str:
    obs = await ws.execute(ToolCall(name="shell", args={"cmd": cmd}))
    assert obs.error is None, obs
    return obs.output.strip()


@pytest.mark.parametrize("kind", ["directory", "tarball"])
async def test_workspace_on_a_given_image(make_runtime, tmp_path: Path, kind: str) -> None:
    root = build_minimal_rootfs(tmp_path / "rootfs", marker=f"from-{kind}")
    image = root
    if kind == "tarball":
        image = tmp_path / "rootfs.tar"
        subprocess.run(["tar", "-C", str(root), "-cf", str(image), "."], check=True)
    rt: WorkspaceRuntime = await make_runtime(image=image)
    ws = await rt.create(heap_app())
    assert await sh(ws, "cat /etc/image-marker; id -un") == f"from-{kind}\nagent"
    listing = (await sh(ws, "ls /usr/bin")).split()
    assert "python3" not in listing and "cat" in listing  # this image's /usr, not the host's
    await sh(ws, "echo mine > ~/f")
    clone = await ws.fork()
    assert await sh(clone, "cat ~/f; cat /etc/image-marker") == f"mine\nfrom-{kind}"
    await sh(clone, "echo clone > ~/f")
    assert await sh(ws, "cat ~/f") == "mine"
    # the image itself is never written
    assert not (root / "home").exists()


async def test_image_that_is_not_a_root_file_system_is_refused(make_runtime, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    from bunshin.envs.runtime.image import ImageError

    with pytest.raises(ImageError, match="no bin/ or usr/bin/"):
        await make_runtime(image=tmp_path / "empty")

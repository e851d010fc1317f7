"""Declared workspace images: a recipe's digest, the store (only complete images of the same digest, a failed or
overrun build leaves nothing), workspaces standing on their app's image and not on the host's /usr, and the same
verdicts on a host with more tools installed.

Builds run mmdebstrap against the Debian archive (the package registry CI reaches); the images the suites use are
built by scripts/setup.sh --all-images before the tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from bunshin.envs import AppSpec, ToolCall, Workspace
from bunshin.envs.images.recipes import RECIPES, ImageRecipe, UnknownImage, recipe
from bunshin.envs.images.store import ImageBuildFailed, ImageNotBuilt, ImageStore, Manifest, installed_packages

REPO = Path(__file__).resolve().parent.parent


def heap_on(image: str | None) -> AppSpec:
    return AppSpec(target="bunshin.envs.runtime.heap_app:HeapApp", kwargs={"size_bytes": 1 << 20}, image=image)


async def sh(ws: Workspace, cmd: str) -> tuple[int | None, str]:
    obs = await ws.execute(ToolCall(name="shell", args={"cmd": cmd}))
    return obs.exit_code, obs.output.strip()


def builders() -> list[str]:
    """Command lines of mmdebstrap processes now."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "mmdebstrap" in cmd and "--variant=minbase" in cmd:
                found.append(cmd)
    return found


def mounts_under(path: Path) -> list[str]:
    return [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(path) in line]


# -- recipes ----------------------------------------------------------------------------------------------------------


def test_a_recipe_digest_is_what_decides_its_contents() -> None:
    a = ImageRecipe(name="a", description="one", packages=("python3", "chromium"))
    assert a.digest() == ImageRecipe(name="a", description="two", packages=("chromium", "python3", "python3")).digest()
    assert a.digest() != ImageRecipe(name="a", description="one", packages=("python3",)).digest()
    assert a.digest() != ImageRecipe(name="a", description="one", packages=("python3", "chromium"),
                                     release="trixie").digest()
    assert a.key() == f"a-{a.digest()[:16]}"
    # the suites' images are declared, and each says what it is for
    assert {"base", "chromium"} <= set(RECIPES) and all(r.description for r in RECIPES.values())
    with pytest.raises(UnknownImage, match="unknown workspace image 'nope'; declared: base, chromium"):
        recipe("nope")


# -- the store ------------------------------------------------------------------------------------------------------


def fake_built(store: Path, wanted: ImageRecipe, digest: str | None = None) -> Path:
    path = store / wanted.key()
    (path / "root" / "usr").mkdir(parents=True)
    manifest = Manifest(recipe=wanted, digest=digest or wanted.digest(), packages={"python3": "3.11"}, size_bytes=1,
                        built_at="2026-12-05T00:00:00Z", build_seconds=1.0, builder="test")
    (path / "manifest.json").write_bytes(msgspec.json.encode(manifest))
    return path


def test_the_store_hands_out_only_complete_images_of_the_recipes_digest(tmp_path: Path) -> None:
    store = ImageStore(tmp_path)
    wanted = ImageRecipe(name="t", description="test", packages=("python3",))
    assert store.find(wanted) is None
    with pytest.raises(ImageNotBuilt, match=r"'t' \(t-[0-9a-f]{16}\) is not built .*bunshin images build t"):
        store.require(wanted)
    path = fake_built(tmp_path, wanted, digest="0" * 64)  # a manifest of another digest under this key
    assert store.find(wanted) is None
    (path / "manifest.json").write_text("{half a manifest")
    assert store.find(wanted) is None and store.built() == []
    (path / "manifest.json").unlink()
    path.rename(tmp_path / "elsewhere")
    path = fake_built(tmp_path, wanted)
    assert store.require(wanted).root == path / "root"
    assert [b.name for b in store.built()] == ["t"]


def test_installed_packages_are_read_from_the_images_own_dpkg_status(tmp_path: Path) -> None:
    status = tmp_path / "var/lib/dpkg/status"
    status.parent.mkdir(parents=True)
    status.write_text("Package: a\nStatus: install ok installed\nVersion: 1.0\nDescription: x\n continued: line\n\n"
                      "Package: b\nStatus: deinstall ok config-files\nVersion: 2\n\n"
                      "Package: c\nStatus: install ok installed\nVersion: 3:1.2-1\n")
    assert installed_packages(tmp_path) == {"a": "1.0", "c": "3:1.2-1"}


@pytest.mark.skipif(os.geteuid() != 0, reason="mmdebstrap --mode=root")
def test_a_build_that_fails_names_the_culprit_and_leaves_nothing(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "images")
    wanted = ImageRecipe(name="broken", description="test", packages=("python3", "no-such-package-bunshin"))
    lines: list[str] = []
    with pytest.raises(ImageBuildFailed, match="image broken: mmdebstrap exited") as caught:
        store.build(wanted, lines.append, timeout_s=600)
    assert "no-such-package-bunshin" in str(caught.value)
    assert any("running apt-get update" in line for line in lines)  # progress was shown
    assert sorted(p.name for p in store.root.iterdir()) == [f".{wanted.key()}.lock"]
    assert builders() == [] and mounts_under(store.root) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="mmdebstrap --mode=root")
def test_a_build_past_its_deadline_is_stopped_and_leaves_nothing(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "images")
    wanted = ImageRecipe(name="slow", description="test", packages=("python3",))
    with pytest.raises(ImageBuildFailed, match="image slow: not built within 4 s"):
        store.build(wanted, timeout_s=4)
    assert sorted(p.name for p in store.root.iterdir()) == [f".{wanted.key()}.lock"]
    assert builders() == [] and mounts_under(store.root) == []


# -- workspaces on their image ----------------------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["cow", "restore"])
async def test_a_workspace_and_its_clones_stand_on_the_apps_image_not_the_hosts(make_runtime, backend: str) -> None:
    base = ImageStore().require(recipe("base"))  # built by scripts/setup.sh
    host_only = "/usr/sbin/mkfs.btrfs"  # the runtime needs it on the host; the base image does not hold it
    assert Path(host_only).exists() and not (base.root / host_only.lstrip("/")).exists()
    rt = await make_runtime(backend=backend)
    ws = await rt.create(heap_on("base"))
    clone = await ws.fork()
    try:
        for w in (ws, clone):
            code, out = await sh(w, f"test -e {host_only}; echo $?; . /etc/os-release; echo $VERSION_ID; id -un; "
                                    "python3 -c 'import sys; print(sys.version.split()[0])'; touch /usr/x 2>&1")
            lines = out.splitlines()
            assert lines[:4] == ["1", "12", "agent", base.manifest.packages["python3"].split("-")[0]], out
            assert "Read-only file system" in lines[4]
        # the image's /usr is bound from the store, its /etc and /var copied once into the run's pool
        assert rt.images.placed["base"].binds[0].pair() == (str(base.root / "usr"), "/usr")
        assert (rt.layers.root / rt.images.placed["base"].lower / "etc/passwd").read_text().count("agent:x:65000") == 1
    finally:
        await clone.close()
        await ws.close()


@pytest.mark.asyncio
async def test_an_image_not_built_or_not_declared_is_refused_before_anything_starts(make_runtime,
                                                                                   tmp_path: Path) -> None:
    rt = await make_runtime(image_store=ImageStore(tmp_path / "empty"))
    with pytest.raises(ImageNotBuilt, match="workspace image 'base'"):
        await rt.create(heap_on("base"))
    with pytest.raises(UnknownImage, match="'nope'"):
        await rt.create(heap_on("nope"))
    assert rt.workspaces == {}  # and make_runtime checks that nothing leaked


# -- the same verdicts whatever the host has -------------------------------------------------------------------------

EXTRA_TOOLS = ("xrandr", "lp", "nmcli", "thunderbird", "gimp", "libreoffice", "bluetoothctl", "chromium")


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts over the host's /usr/bin in a private mount namespace")
def test_the_desktops_infeasible_tasks_get_the_same_verdicts_on_a_host_with_more_tools(tmp_path: Path) -> None:
    """The grounded reader gives up an infeasible task when the desktop lacks the program it needs; on a host whose
    /usr/bin has every such program (an overlay over it, in a mount namespace of the test's own), the workspace
    still has only its image's, and every verdict is the same."""
    more_tools = _more_tools(tmp_path)
    results = {}
    for host in ("plain", "more tools"):
        out = tmp_path / host.replace(" ", "-")
        eval_cmd = [sys.executable, "-m", "bunshin.engine.cli", "eval", "--suite", "desktop", "--policy", "grounded",
                    "--task-dir", str(REPO / "envs/desktop/tasks/infeasible"), "--group-size", "1",
                    "--time-scale", "0", "--out", str(out)]
        script = (more_tools if host == "more tools" else "") + 'exec "$@"'
        proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *eval_cmd],
                              capture_output=True, text=True, timeout=900, cwd=REPO)
        assert proc.returncode == 0, proc.stderr[-3000:]
        rewards = {}
        for line in (out / "trajectories.jsonl").read_text().splitlines():
            record = json.loads(line)
            rewards[record["task_id"]] = record["reward"]
        results[host] = rewards
    assert len(results["plain"]) == 8 and set(results["plain"].values()) == {1.0}  # each given up, rightly
    assert results["more tools"] == results["plain"]


def _more_tools(tmp_path: Path) -> str:
    """A shell prefix that, in the mount namespace it runs in, lays an overlay with ``EXTRA_TOOLS`` over /usr/bin."""
    upper, work = tmp_path / "upper", tmp_path / "work"
    upper.mkdir()
    work.mkdir()
    for tool in EXTRA_TOOLS:
        (upper / tool).write_text("#!/bin/sh\nexit 0\n")
        (upper / tool).chmod(0o755)
    return (f"mount -t overlay overlay -o lowerdir=/usr/bin,upperdir={upper},workdir={work} /usr/bin && "
            f"command -v {' '.join(EXTRA_TOOLS)} >/dev/null && ")


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="mounts over the host's /usr/bin in a private mount namespace")
def test_the_real_desktops_tasks_get_the_same_verdicts_on_a_host_with_more_tools(tmp_path: Path) -> None:
    """The osworld suite's workspaces stand on the image ``desktop``: a task that checks which programs the desktop
    has, and an embedded infeasible task, get the same verdicts from ``suite check`` (OSWorld's judge and ours)
    on a host whose /usr/bin has programs the image lacks."""
    tasks = tmp_path / "tasks"
    (tasks / "os").mkdir(parents=True)
    for infeasible in sorted((REPO / "envs/xdesktop/tasks/infeasible").glob("*.json"))[:1]:
        (tasks / "os" / infeasible.name).write_text(infeasible.read_text())
    probe = "for t in xrandr lp nmcli bluetoothctl; do command -v $t >/dev/null && echo $t; done; echo end"
    (tasks / "os" / "tools.json").write_text(json.dumps({
        "id": "which-tools", "instruction": "Say done.", "snapshot": "os", "related_apps": ["os"], "config": [],
        "evaluator": {"func": "exact_match", "result": {"type": "vm_command_line", "command": probe, "shell": True},
                      "expected": {"type": "rule", "rules": {"expected": "end\n"}}},
        "bunshin_reference": [{"name": "DONE", "args": {}}]}))
    reports = {}
    for host in ("plain", "more tools"):
        out = tmp_path / f"{host.replace(' ', '-')}.json"
        check = [sys.executable, "-m", "bunshin.engine.cli", "suite", "check", "--suite", "osworld", "--task-dir",
                 str(tasks), "--files-cache", str(tmp_path / "files"), "--set", "observe=", "--json", str(out)]
        script = (_more_tools(tmp_path) if host == "more tools" else "") + 'exec "$@"'
        proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *check],
                              capture_output=True, text=True, timeout=900, cwd=REPO)
        report = json.loads(out.read_text())
        reports[host] = {k: report[k] for k in ("tasks", "oracle_pass", "null_pass", "failures")}
        assert proc.returncode == 0, (host, report["failures"], proc.stderr[-2000:])
    assert reports["plain"]["tasks"] == reports["plain"]["oracle_pass"] == 2
    assert reports["more tools"] == reports["plain"]


def test_prune_removes_what_no_recipe_names_and_keeps_the_rest(tmp_path: Path) -> None:
    store = ImageStore(tmp_path)
    current = ImageRecipe(name="t", description="test", packages=("python3",))
    older = ImageRecipe(name="t", description="test", packages=("python3", "gone"))
    fake_built(tmp_path, current)
    fake_built(tmp_path, older)
    (tmp_path / f"{current.key()}.partial-99999").mkdir()  # a killed build's
    assert sorted(store.prune({current.key()})) == sorted([older.key(), f"{current.key()}.partial-99999"])
    assert [b.path.name for b in store.built()] == [current.key()]

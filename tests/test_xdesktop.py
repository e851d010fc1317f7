"""The X desktop app: a workspace on the image ``desktop`` starts its session, and OSWorld's VM API routes answer
with OSWorld's shapes, as the agent, through the tool ``vm`` (the HTTP face over it is the adapter's)."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from bunshin.envs import AppSpec, Limits, ToolCall, Workspace, WorkspaceRuntime

pytestmark = pytest.mark.asyncio

DESKTOP = AppSpec(target="bunshin.envs.xdesktop.app:XDesktopApp", image="desktop")
STATE = "{https://accessibility.ubuntu.example.org/ns/state}"


async def vm(ws: Workspace, method: str, path: str, **request: Any) -> tuple[int, str, bytes]:
    obs = await ws.execute(ToolCall(name="vm", args={"method": method, "path": path, **request}))
    assert obs.error is None, obs.error
    return obs.data["status"], obs.data["content_type"], obs.data["body"]


async def vm_json(ws: Workspace, method: str, path: str, **request: Any) -> tuple[int, Any]:
    status, kind, body = await vm(ws, method, path, **request)
    assert kind == "application/json", (status, kind, body[:300])
    return status, json.loads(body)


@pytest_asyncio.fixture
async def desktop(make_runtime, request: pytest.FixtureRequest) -> Workspace:
    if "uvloop" in request.node.name:
        pytest.skip("the routes run in the host: the engine's event loop does not matter; one pass is enough")
    rt: WorkspaceRuntime = await make_runtime(limits=Limits(memory_bytes=4 << 30, pids=1024, command_timeout_s=150))
    return await rt.create(DESKTOP)


async def test_the_session_answers_and_execute_runs_as_the_agent_in_it(desktop: Workspace) -> None:
    status, body = await vm_json(desktop, "POST", "/execute", json={"command": ["python", "-c",
                                 "import pyautogui, os; print(tuple(pyautogui.size()), os.getuid())"]})
    assert status == 200 and body == {"status": "success", "output": "(1920, 1080) 65000\n", "error": "",
                                      "returncode": 0}
    status, body = await vm_json(desktop, "POST", "/execute",
                                 json={"command": "echo out; echo err >&2; exit 3", "shell": True})
    assert (status, body["output"], body["error"], body["returncode"]) == (200, "out\n", "err\n", 3)
    status, body = await vm_json(desktop, "POST", "/execute", json={"command": "ls ~/Desktop", "shell": False})
    assert status == 200 and body["returncode"] == 0
    assert await vm_json(desktop, "POST", "/screen_size", json={}) == (200, {"width": 1920, "height": 1080})
    assert await vm(desktop, "GET", "/platform") == (200, "text/html; charset=utf-8", b"Linux")
    status, body = await vm_json(desktop, "GET", "/cursor_position")
    assert status == 200 and len(body) == 2
    assert await vm_json(desktop, "POST", "/desktop_path", json={}) == (200, {"desktop_path": "/home/agent/Desktop"})
    assert (await vm(desktop, "GET", "/nope"))[0] == 404
    assert (await vm(desktop, "GET", "/execute"))[0] == 405


async def test_a_screenshot_is_a_png_of_the_screen(desktop: Workspace) -> None:
    status, kind, png = await vm(desktop, "GET", "/screenshot")
    assert (status, kind) == (200, "image/png") and png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == (1920, 1080)


async def test_files_go_in_and_out_with_the_agents_rights_only(desktop: Workspace) -> None:
    status, kind, body = await vm(desktop, "POST", "/setup/upload", form={"file_path": "~/docs/a b.txt"},
                                  files={"file_data": b"hello\x00world"})
    assert (status, body) == (200, b"File Uploaded: 11 bytes")
    status, kind, body = await vm(desktop, "POST", "/file", form={"file_path": "/home/agent/docs/a b.txt"})
    assert (status, body) == (200, b"hello\x00world")
    assert await vm_json(desktop, "POST", "/list_directory", json={"path": "/home/agent/docs"}) == (
        200, {"directory_tree": {"type": "directory", "name": "docs", "children": [{"type": "file", "name": "a b.txt"}]}})
    # root's files stay root's, through a symlink of the agent's too
    await vm_json(desktop, "POST", "/execute", json={"command": "ln -s /etc/shadow ~/shadow", "shell": True})
    for path in ("/etc/shadow", "~/shadow"):
        status, body = await vm_json(desktop, "POST", "/file", form={"file_path": path})
        assert status == 500 and "Permission denied" in body["error"], body
    assert await vm_json(desktop, "POST", "/file", form={"file_path": "~/none"}) == (404, {"error": "File not found"})
    status, body = await vm_json(desktop, "POST", "/setup/upload", form={"file_path": "/etc/evil"},
                                 files={"file_data": b"x"})
    assert status == 500 and "Permission denied" in body["error"]
    assert await vm_json(desktop, "POST", "/file", form={}) == (400, {"error": "file_path is required"})


async def test_an_app_launched_opens_a_window_the_wm_activates_and_the_a11y_tree_shows(desktop: Workspace) -> None:
    status, _, body = await vm(desktop, "POST", "/setup/launch", json={"command": ["gedit", "--new-window"]})
    assert (status, body) == (200, b"gedit --new-window launched successfully")
    status, body = await vm_json(desktop, "POST", "/execute_with_verification",
                                 json={"command": ["true"], "verification": {"window_exists": "gedit"},
                                       "max_wait_time": 60, "check_interval": 0.5})
    assert status == 200 and body["verification"] == "passed", body
    status, _, body = await vm(desktop, "POST", "/setup/activate_window", json={"window_name": "gedit"})
    assert (status, body) == (200, b"Window activated successfully")
    status, size = await vm_json(desktop, "POST", "/window_size", form={"app_class_name": "gedit"})
    assert status == 200 and size["width"] > 100 and size["height"] > 100
    await vm_json(desktop, "POST", "/execute", json={"command": ["python", "-c",
                  "import pyautogui, time; time.sleep(1); pyautogui.typewrite('bunshin types here')"]})
    status, body = await vm_json(desktop, "GET", "/accessibility")
    assert status == 200
    from xml.etree import ElementTree

    root = ElementTree.fromstring(body["AT"])
    assert root.tag == "desktop-frame"
    apps = {app.get("name"): app for app in root}
    assert "gedit" in apps, sorted(apps)
    texts = [node.text or "" for node in apps["gedit"].iter() if node.tag in ("text", "document-text")]
    assert any("bunshin types here" in text for text in texts), texts
    frames = [node for node in apps["gedit"].iter("frame") if node.get(f"{STATE}active") == "true"]
    assert frames and frames[0].get("{https://accessibility.ubuntu.example.org/ns/component}size")
    status, _, body = await vm(desktop, "POST", "/setup/close_window", json={"window_name": "gedit"})
    assert (status, body) == (200, b"Window closed successfully.")


async def test_run_python_and_run_bash_script_answer_as_osworld_documents(desktop: Workspace) -> None:
    status, body = await vm_json(desktop, "POST", "/run_python", json={"code": "import sys; print(1); sys.exit(2)"})
    assert status == 200 and body["status"] == "error" and body["return_code"] == 2
    assert body["output"] == "1\n" and body["error"] == "Process exited with code 2"
    assert (await vm_json(desktop, "POST", "/run_python", json={}))[0] == 400
    status, body = await vm_json(desktop, "POST", "/run_bash_script",
                                 json={"script": "pwd; echo e >&2", "working_dir": "~/Desktop"})
    assert status == 200 and body == {"status": "success", "output": "/home/agent/Desktop\ne\n", "error": "",
                                      "returncode": 0}
    status, body = await vm_json(desktop, "POST", "/run_bash_script", json={"script": "sleep 5", "timeout": 1})
    assert status == 500 and body["output"] == "Script execution timed out after 1 seconds"
    status, body = await vm_json(desktop, "POST", "/run_bash_script", json={"script": "true", "working_dir": "/no"})
    assert status == 400 and body["output"] == "Working directory does not exist: /no"


async def test_a_command_that_runs_over_is_killed_alone_and_the_app_a_task_launched_lives_on(
        desktop: Workspace) -> None:
    """A VM API command past its timeout is killed with what it started in its session, as OSWorld's server
    kills it; the application a task launched (its own session) lives on. (Killing every agent process, as an
    agent's ``shell`` timeout does, closed LibreOffice whenever reading the accessibility tree ran over.)"""
    status, _, body = await vm(desktop, "POST", "/setup/launch", json={"command": ["gedit", "--new-window"]})
    assert status == 200, body
    verify = {"command": ["true"], "verification": {"window_exists": "gedit"}, "max_wait_time": 60,
              "check_interval": 0.5}
    assert (await vm_json(desktop, "POST", "/execute_with_verification", json=verify))[1]["verification"] == "passed"
    status, body = await vm_json(desktop, "POST", "/run_bash_script",
                                 json={"script": "sleep 1234 & sleep 30", "timeout": 1})
    assert status == 500 and body["output"] == "Script execution timed out after 1 seconds"
    status, body = await vm_json(desktop, "POST", "/execute", json={"command": "pgrep -c -x gedit; pgrep -c -f "
                                                                              "'slee[p] 1234'", "shell": True})
    assert body["output"].split() == ["1", "0"], body  # gedit runs; the command's background job went with it
    assert (await vm_json(desktop, "POST", "/execute_with_verification", json=verify))[1]["verification"] == "passed"


async def test_a_desktop_workspace_refuses_a_live_fork_and_its_session_ends_with_it(desktop: Workspace) -> None:
    from bunshin.envs import ForkFailed

    with pytest.raises(ForkFailed, match="cannot be forked live"):
        await desktop.fork()
    status, body = await vm_json(desktop, "POST", "/execute", json={"command": "echo alive", "shell": True})
    assert body["output"] == "alive\n"  # the refused fork left it serving
    pids = set(desktop.cgroup.procs())
    assert len(pids) >= 4  # the host, Xvfb, the bus, openbox
    await desktop.close()
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pids)


async def test_recording_wallpaper_and_the_rest_of_the_routes(desktop: Workspace) -> None:
    from bunshin.envs.xdesktop.vm_api import ROUTES

    assert len({path for _, path in ROUTES}) == 26  # OSWorld's server's 26 URL rules
    assert await vm_json(desktop, "POST", "/start_recording") == (
        200, {"status": "success", "message": "Started recording successfully."})
    assert (await vm_json(desktop, "POST", "/start_recording"))[0] == 400
    status, kind, mp4 = await vm(desktop, "POST", "/end_recording")
    assert (status, kind) == (200, "video/mp4") and mp4[4:8] == b"ftyp"
    assert (await vm_json(desktop, "POST", "/end_recording"))[0] == 400
    await vm(desktop, "POST", "/setup/upload", form={"file_path": "~/wall.png"},
             files={"file_data": (await vm(desktop, "GET", "/screenshot"))[2]})
    assert await vm(desktop, "POST", "/setup/change_wallpaper", json={"path": "~/wall.png"}) == (
        200, "text/html; charset=utf-8", b"Wallpaper changed successfully")
    status, kind, png = await vm(desktop, "POST", "/wallpaper")
    assert (status, kind) == (200, "image/png") and png[:4] == b"\x89PNG"
    status, _, body = await vm(desktop, "POST", "/setup/download_file", json={"url": "http://x/y", "path": "~/y"})
    assert status == 500 and b"no network" in body


async def test_a_desktop_with_ksm_has_every_program_opted_in_and_one_without_none(make_runtime,
                                                                                  request: pytest.FixtureRequest) -> None:
    from bunshin.envs.runtime import ksm
    from bunshin.envs.xdesktop.app import desktop_app

    if "uvloop" in request.node.name:
        pytest.skip("one pass is enough")
    if not ksm.available():
        pytest.skip("kernel without KSM")

    def opted_in(pid: int) -> bool | None:
        try:
            flag = "ksm_merge_any: yes" in Path(f"/proc/{pid}/ksm_stat").read_text()
            alive = int(Path(f"/proc/{pid}/statm").read_text().split()[0]) > 0  # read after: not exiting meanwhile
        except (OSError, ValueError, IndexError):
            return None  # gone meanwhile
        return flag if alive else None

    rt: WorkspaceRuntime = await make_runtime(limits=Limits(memory_bytes=4 << 30, pids=1024, command_timeout_s=150))
    merged, plain = await rt.create(desktop_app(ksm=True)), await rt.create(desktop_app())
    for ws, wanted in ((merged, True), (plain, False)):
        await vm(ws, "POST", "/setup/launch", json={"command": ["gedit"]})
        await vm_json(ws, "POST", "/execute_with_verification", json={
            "command": ["true"], "verification": {"window_exists": "gedit"}, "max_wait_time": 60})
        seen = {pid: opted_in(pid) for pid in ws.cgroup.procs()}
        seen = {pid: flag for pid, flag in seen.items() if flag is not None}
        assert len(seen) >= 5 and set(seen.values()) == {wanted}, seen  # host, Xvfb, bus, openbox, gedit...
    assert ksm.holders()  # the run tunes ksmd while a desktop that opted in lives
    await merged.close()
    await plain.close()


async def test_a_module_the_agent_plants_never_builds_the_tree_the_judge_reads(desktop: Workspace) -> None:
    fake = "raise SystemExit('planted')"
    for module in ("pyatspi", "json", "sitecustomize", "usercustomize"):
        await vm(desktop, "POST", "/setup/upload", form={"file_path": f"~/.local/lib/python3.11/site-packages/{module}.py"},
                 files={"file_data": fake.encode()})
    status, body = await vm_json(desktop, "GET", "/accessibility")
    assert status == 200 and body["AT"].startswith("<desktop-frame")
    status, body = await vm_json(desktop, "POST", "/list_directory", json={"path": "/home/agent/.local/lib"})
    site = body["directory_tree"]["children"][0]["children"][0]
    assert status == 200 and site["name"] == "site-packages"
    assert sorted(child["name"] for child in site["children"]) == [
        "json.py", "pyatspi.py", "sitecustomize.py", "usercustomize.py"]


# the image's other applications (the osworld tasks use Calc, Writer, gedit, the terminal, Chromium and VLC): each
# is launched as OSWorld's tasks launch it and must show its window
OTHER_APPS = [(["gimp"], "GNU Image Manipulation Program"), (["thunderbird"], "Thunderbird"),
              (["libreoffice", "--impress"], "Impress"), (["xterm"], "xterm")]


@pytest.mark.slow
async def test_every_other_application_of_the_image_opens_its_window(desktop: Workspace) -> None:
    for command, title in OTHER_APPS:
        status, _, body = await vm(desktop, "POST", "/setup/launch", json={"command": command})
        assert status == 200, body
        status, verified = await vm_json(desktop, "POST", "/execute_with_verification",
                                         json={"command": ["true"], "verification": {"window_exists": title},
                                               "max_wait_time": 120, "check_interval": 1})
        assert status == 200 and verified["verification"] == "passed", (command, verified)


def run_processes(run_id: str) -> list[tuple[int, str]]:
    """(pid, program) of every process in run ``run_id``'s cgroups: hosts, desktop programs, applications."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            groups = (entry / "cgroup").read_text()
            program = (entry / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if f"bunshin-{run_id}" in groups and program:
            found.append((int(entry.name), program))
    return found


async def test_an_engine_killed_leaves_no_desktop_program(state_dir: Path, request: pytest.FixtureRequest) -> None:
    """kill -9 of an engine whose desktop runs Xvfb, D-Bus, AT-SPI, LibreOffice and gedit: every program of it dies
    with its host, and the next start removes the rest (cgroups, mounts, directories)."""
    import asyncio
    import subprocess
    import sys

    from .conftest import leftovers
    from .quiet import settled

    if "uvloop" in request.node.name:
        pytest.skip("one pass is enough")
    victim = await asyncio.create_subprocess_exec(sys.executable, "-m", "tests.desktop_victim", str(state_dir),
                                                  stdout=subprocess.PIPE, cwd=Path(__file__).parent.parent)
    try:
        assert victim.stdout is not None
        _, run_id, run_dir_text = (await asyncio.wait_for(victim.stdout.readline(), 120)).decode().split()
        assert (await asyncio.wait_for(victim.stdout.readline(), 240)).decode().strip() == "up"
        programs = {program.rsplit("/", 1)[-1] for _, program in run_processes(run_id)}
        assert {"Xvfb", "dbus-daemon", "openbox", "soffice.bin", "gedit"} <= programs, programs
        assert any("at-spi" in p for p in programs), programs
    finally:
        victim.kill()
        await victim.wait()
    assert await settled(lambda: run_processes(run_id), 20) == []  # every program died with its host
    rt = WorkspaceRuntime(state_dir=state_dir)
    await rt.start()  # and the next start cleans the rest of the run
    try:
        assert leftovers(run_id, Path(run_dir_text), ignore=frozenset({rt.nursery.pid})) == []
    finally:
        await rt.close()


async def test_the_agent_reaches_its_own_display_and_bus_but_not_the_hosts(desktop: Workspace) -> None:
    """A display and a bus of the host (an abstract X socket, a path socket under /run) are out of the agent's
    reach: the abstract name space is the workspace's network namespace's, /run is the workspace's own."""
    import socket

    probe = ("import socket\n"
             "for name in ('\\0/tmp/.X11-unix/X0', '\\0/tmp/.X11-unix/X7', '/run/bunshin-host-bus'):\n"
             "    s = socket.socket(socket.AF_UNIX)\n"
             "    try:\n        s.connect(name); print('reached')\n"
             "    except OSError as e: print('refused', e.errno)\n")
    bus_path = "/run/bunshin-host-bus"
    with socket.socket(socket.AF_UNIX) as display, socket.socket(socket.AF_UNIX) as bus:
        display.bind("\0/tmp/.X11-unix/X7")
        display.listen()
        bus.bind(bus_path)
        bus.listen()
        try:
            status, out = await vm_json(desktop, "POST", "/execute", json={"command": ["python3", "-c", probe]})
        finally:
            os.unlink(bus_path)
    assert status == 200, out
    own, host_display, host_bus = out["output"].split("\n")[:3]
    assert own == "reached"  # its own Xvfb
    assert host_display.startswith("refused") and host_bus.startswith("refused"), out

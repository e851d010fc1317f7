"""OSWorld's own controllers, unmodified (desktop-env 1.0.2, the osworld extra), against a desktop workspace's VM
API over HTTP: every route a controller calls answers what the controller expects. The HTTP server listens on the
engine's loopback only; the agent, in the workspace's network namespace, cannot reach it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from bunshin.envs import AppSpec, Limits, ToolCall, WorkspaceRuntime
from bunshin.envs.xdesktop.http import VmHttpServer

pytestmark = pytest.mark.asyncio

DESKTOP = AppSpec(target="bunshin.envs.xdesktop.app:XDesktopApp", image="desktop")


def python_controller(port: int, tmp: Path) -> dict[str, Any]:
    """Every PythonController method, as OSWorld's DesktopEnv and getters call them."""
    from desktop_env.controllers.python import PythonController

    c = PythonController(vm_ip="127.0.0.1", server_port=port)
    seen: dict[str, Any] = {}
    seen["platform"] = c.get_vm_platform()  # through /execute: python -c with pyautogui imported
    seen["screen"] = c.get_vm_screen_size()
    seen["screenshot"] = c.get_screenshot()
    seen["python"] = c.execute_python_command("print(pyautogui.size().width)")
    seen["desktop"] = c.get_vm_desktop_path()
    seen["run_python"] = c.run_python_script("print(6 * 7)")
    seen["run_bash"] = c.run_bash_script("cd ~/Desktop && echo made > made.txt && ls", timeout=20)
    seen["file"] = c.get_file("/home/agent/Desktop/made.txt")
    seen["tree"] = c.get_vm_directory_tree("/home/agent/Desktop")
    c.start_recording()
    c.end_recording(str(tmp / "rec.mp4"))
    seen["recording"] = (tmp / "rec.mp4").read_bytes()[4:8]
    seen["a11y"] = c.get_accessibility_tree()
    seen["terminal"] = c.get_terminal_output()
    return seen


def setup_controller(port: int, tmp: Path) -> dict[str, Any]:
    """OSWorld's SetupController running a task config that uses every step type that reaches the VM here."""
    from desktop_env.controllers.python import PythonController
    from desktop_env.controllers.setup import SetupController

    (tmp / "notes.txt").write_text("first line\n")
    (tmp / "cache").mkdir()
    setup = SetupController(vm_ip="127.0.0.1", server_port=port, cache_dir=str(tmp / "cache"))
    config = [
        {"type": "upload_file", "parameters": {"files": [{"local_path": str(tmp / "notes.txt"),
                                                          "path": "/home/agent/notes.txt"}]}},
        {"type": "execute", "parameters": {"command": "cp ~/notes.txt ~/Desktop/copy.txt && echo {SCREEN_WIDTH}",
                                           "shell": True, "stdout": "copied.txt"}},
        {"type": "launch", "parameters": {"command": ["gedit", "--new-window", "/home/agent/notes.txt"]}},
        {"type": "execute_with_verification", "parameters": {"command": ["true"],
                                                             "verification": {"window_exists": "notes.txt"},
                                                             "max_wait_time": 60, "check_interval": 0.5}},
        {"type": "activate_window", "parameters": {"window_name": "notes.txt", "strict": False}},
        {"type": "sleep", "parameters": {"seconds": 0.5}},
        {"type": "change_wallpaper", "parameters": {"path": "/home/agent/wall.png"}},
        {"type": "close_window", "parameters": {"window_name": "notes.txt"}},
        {"type": "open", "parameters": {"path": "/home/agent/Desktop/copy.txt"}},
    ]
    c = PythonController(vm_ip="127.0.0.1", server_port=port)
    c.execute_python_command("pyautogui.screenshot('/home/agent/wall.png')")
    ok = setup.setup(config)
    windows = c.execute_python_command("import subprocess; print(subprocess.run(['wmctrl', '-l'], "
                                       "capture_output=True, text=True).stdout)")
    return {"ok": ok, "copied": (tmp / "cache" / "copied.txt").read_text(), "windows": windows["output"],
            "wallpaper": c.get_vm_wallpaper()}


@pytest.fixture
def http_only(request: pytest.FixtureRequest) -> None:
    if "uvloop" in request.node.name:
        pytest.skip("the controllers speak HTTP to one server: the engine's event loop does not matter here")


async def test_osworlds_python_controller_gets_what_it_expects_from_every_route(
        make_runtime, tmp_path: Path, http_only: None) -> None:
    rt: WorkspaceRuntime = await make_runtime(limits=Limits(memory_bytes=4 << 30, pids=1024, command_timeout_s=150))
    ws = await rt.create(DESKTOP)
    async with VmHttpServer(ws) as server:
        seen = await asyncio.to_thread(python_controller, server.port, tmp_path)
    assert seen["platform"] == "Linux"
    assert seen["screen"] == {"width": 1920, "height": 1080}
    assert seen["screenshot"][:8] == b"\x89PNG\r\n\x1a\n"
    assert seen["python"]["output"] == "1920\n" and seen["python"]["returncode"] == 0
    assert seen["desktop"] == "/home/agent/Desktop"
    assert seen["run_python"]["status"] == "success" and seen["run_python"]["output"] == "42\n"
    assert seen["run_bash"]["returncode"] == 0 and "made.txt" in seen["run_bash"]["output"]
    assert seen["file"] == b"made\n"
    assert seen["tree"] == {"type": "directory", "name": "Desktop",
                            "children": [{"type": "file", "name": "made.txt"}]}
    assert seen["recording"] == b"ftyp"
    assert seen["a11y"].startswith("<desktop-frame")
    assert seen["terminal"] is None  # no GNOME Terminal window is open
    await ws.close()


async def test_osworlds_setup_controller_runs_a_task_config_step_by_step(
        make_runtime, tmp_path: Path, http_only: None) -> None:
    rt: WorkspaceRuntime = await make_runtime(limits=Limits(memory_bytes=4 << 30, pids=1024, command_timeout_s=150))
    ws = await rt.create(DESKTOP)
    async with VmHttpServer(ws) as server:
        seen = await asyncio.to_thread(setup_controller, server.port, tmp_path)
    assert seen["ok"] is True
    assert seen["copied"] == "1920\n"  # {SCREEN_WIDTH} was filled in, stdout written to the cache
    assert "copy.txt" in seen["windows"] and "notes.txt" not in seen["windows"]  # opened; closed
    assert seen["wallpaper"][:4] == b"\x89PNG"
    obs = await ws.execute(ToolCall(name="vm", args={"method": "POST", "path": "/file",
                                                     "form": {"file_path": "~/notes.txt"}}))
    assert obs.data["body"] == b"first line\n"
    await ws.close()


async def test_the_agent_cannot_reach_the_vm_api_and_bad_requests_are_refused(
        make_runtime, http_only: None) -> None:
    import aiohttp

    rt: WorkspaceRuntime = await make_runtime(limits=Limits(memory_bytes=4 << 30, pids=1024, command_timeout_s=150))
    ws = await rt.create(DESKTOP)
    async with VmHttpServer(ws) as server, aiohttp.ClientSession() as http:
        probe = (f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{server.port}/platform', "
                 "timeout=3)")
        async with http.post(f"http://127.0.0.1:{server.port}/execute",
                             json={"command": ["python3", "-c", probe]}) as answer:
            body = await answer.json()
        assert answer.status == 200 and body["returncode"] == 1 and "Connection refused" in body["error"]
        async with http.post(f"http://127.0.0.1:{server.port}/execute", data=b"{not json",
                             headers={"Content-Type": "application/json"}) as answer:
            assert answer.status == 400
        async with http.get(f"http://127.0.0.1:{server.port}/platform") as answer:
            assert (answer.status, await answer.text()) == (200, "Linux")
        await ws.close()
        async with http.get(f"http://127.0.0.1:{server.port}/platform") as answer:
            assert answer.status == 502  # the workspace is gone; the server still answers


def chrome_steps(port: int, cdp_port: int, tmp: Path) -> Any:
    """OSWorld's convention: Chrome on 1337, socat from 9222; then its chrome_open_tabs step and a chrome getter,
    both through Playwright's connect_over_cdp to the engine-side port carried to 9222 inside."""
    from types import SimpleNamespace

    from desktop_env.controllers.setup import SetupController
    from desktop_env.evaluators.getters.chrome import get_open_tabs_info

    for name in ("alpha", "beta"):
        (tmp / f"{name}.html").write_text(f"<html><head><title>page {name}</title></head><body>{name}</body></html>")
    (tmp / "cache").mkdir(exist_ok=True)
    setup = SetupController(vm_ip="127.0.0.1", server_port=port, chromium_port=cdp_port, cache_dir=str(tmp / "cache"))
    setup.setup([
        {"type": "upload_file", "parameters": {"files": [{"local_path": str(tmp / f"{n}.html"),
                                                          "path": f"/home/agent/{n}.html"} for n in ("alpha", "beta")]}},
        {"type": "launch", "parameters": {"command": ["google-chrome", "--remote-debugging-port=1337"]}},
        {"type": "launch", "parameters": {"command": ["socat", "tcp-listen:9222,fork", "tcp:localhost:1337"]}},
        {"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["file:///home/agent/alpha.html",
                                                                     "file:///home/agent/beta.html"]}},
    ])
    env = SimpleNamespace(vm_ip="127.0.0.1", chromium_port=cdp_port, server_port=port)
    return get_open_tabs_info(env, {})


async def test_chrome_is_google_chrome_and_osworlds_cdp_steps_and_getters_reach_it(
        make_runtime, tmp_path: Path, http_only: None) -> None:
    from bunshin.envs.runtime.port_forward import PortForward

    rt: WorkspaceRuntime = await make_runtime(limits=Limits(memory_bytes=4 << 30, pids=1024, command_timeout_s=150))
    ws = await rt.create(DESKTOP)
    async with VmHttpServer(ws) as server, PortForward(ws, 9222) as cdp:
        tabs = await asyncio.to_thread(chrome_steps, server.port, cdp.port, tmp_path)
    # both tabs open (the first tab, Chrome's own, closed by the step); the order CDP lists pages in varies
    assert sorted(tab["title"] for tab in tabs) == ["page alpha", "page beta"], tabs
    await ws.close()

"""OSWorld's VM API, our implementation: the routes OSWorld's controllers call, with its request and response shapes.

Owns: decoding a request (method, path, JSON, form fields, uploaded files), the route table, and each route's
answer: status, content type and body as OSWorld's server gives them (docs/osworld.md lists the routes and where we
differ: we answer where its server raises, e.g. ``/run_bash_script``'s 200, ``/window_size``'s 404). Every route
runs as the agent in the desktop session (``guest.py``), under the deadline of the call that carries it.
Must never: run anything as root on a request's behalf, or answer with unbounded bytes.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from collections.abc import Callable
from typing import Any
from xml.etree import ElementTree

import msgspec

from .guest import MAX_OUTPUT, Guest, GuestError
from .session import SCREEN

EXECUTE_TIMEOUT_S = 120.0  # OSWorld's /execute
RUN_PYTHON_TIMEOUT_S = 30.0
RUN_BASH_TIMEOUT_S = 100.0


class VmRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One HTTP request to the VM API: ``json`` the decoded body of a JSON request, ``form`` its form fields,
    ``files`` its uploaded files' bytes by field name."""

    method: str
    path: str
    json: Any = None
    form: dict[str, str] = {}
    files: dict[str, bytes] = {}


class VmResponse(msgspec.Struct, frozen=True, kw_only=True):
    status: int
    content_type: str
    body: bytes
    filename: str | None = None  # sent as an attachment (``Content-Disposition``)


def text(body: str, status: int = 200) -> VmResponse:
    return VmResponse(status=status, content_type="text/html; charset=utf-8", body=body.encode())


def as_json(value: Any, status: int = 200) -> VmResponse:
    return VmResponse(status=status, content_type="application/json", body=json.dumps(value).encode())


Handler = Callable[["VmApi", VmRequest], VmResponse]


class VmApi:
    """The routes, served for one desktop: ``guest`` runs what they run; ``screen`` is the display's size;
    ``a11y_tree()`` builds the accessibility tree (OSWorld's XML)."""

    def __init__(self, guest: Guest, a11y_tree: Callable[[], str], screen: tuple[int, int] = SCREEN):
        self.guest = guest
        self.a11y_tree = a11y_tree
        self.screen = screen

    def handle(self, request: VmRequest) -> VmResponse:
        route = ROUTES.get((request.method.upper(), request.path))
        if route is None:
            known = {path for _, path in ROUTES}
            if request.path in known:
                return text("<h1>Method Not Allowed</h1>", 405)
            return text("<h1>Not Found</h1>", 404)
        try:
            return route(self, request)
        except GuestError as exc:
            return as_json({"status": "error", "message": str(exc)}, exc.status)

    # -- command execution -------------------------------------------------------------------------------------
    def execute(self, request: VmRequest) -> VmResponse:
        body = _json_body(request)
        shell = bool(body.get("shell", False))
        command = _command(body.get("command", "" if shell else []), shell)
        done = self.guest.run(command, shell=shell, timeout_s=EXECUTE_TIMEOUT_S)
        if done.timed_out:
            return as_json({"status": "error", "message": f"Command '{command}' timed out after "
                                                          f"{EXECUTE_TIMEOUT_S:g} seconds"}, 500)
        return as_json({"status": "success", "output": done.stdout, "error": done.stderr,
                        "returncode": done.returncode})

    def execute_with_verification(self, request: VmRequest) -> VmResponse:
        body = _json_body(request)
        shell = bool(body.get("shell", False))
        command = _command(body.get("command", "" if shell else []), shell)
        verification = body.get("verification") or {}
        max_wait, interval = float(body.get("max_wait_time", 10)), float(body.get("check_interval", 1))
        done = self.guest.run(command, shell=shell, timeout_s=EXECUTE_TIMEOUT_S)
        result = {"output": done.stdout, "error": done.stderr, "returncode": done.returncode}
        if not verification:
            return as_json({"status": "success", **result})
        started = time.monotonic()
        while True:
            ok = True
            if "window_exists" in verification:
                windows = self.guest.run(["wmctrl", "-l"], shell=False, timeout_s=10).stdout
                ok = str(verification["window_exists"]).lower() in windows.lower()
            if ok and "command_success" in verification:
                ok = self.guest.run(str(verification["command_success"]), shell=True, timeout_s=5).returncode == 0
            waited = time.monotonic() - started
            if ok:
                return as_json({"status": "success", **result, "verification": "passed", "wait_time": waited})
            if waited >= max_wait:
                return as_json({"status": "verification_failed", **result, "verification": "failed",
                                "wait_time": max_wait}, 500)
            time.sleep(max(0.0, min(interval, max_wait - waited)))

    def launch(self, request: VmRequest) -> VmResponse:
        body = _json_body(request)
        shell = bool(body.get("shell", False))
        command = _command(body.get("command", "" if shell else []), shell)
        if not shell:
            assert isinstance(command, list)
            if not command:
                return as_json({"status": "error", "message": "an empty command"}, 500)
            found = self.guest.run(["sh", "-c", 'command -v -- "$1"', "sh", command[0]], shell=False, timeout_s=10)
            if found.returncode != 0:
                return as_json({"status": "error",
                                "message": f"[Errno 2] No such file or directory: '{command[0]}'"}, 500)
        self.guest.start(command, shell=shell)
        shown = str(command) if shell else " ".join(command)
        return text(f"{shown} launched successfully")

    def run_python(self, request: VmRequest) -> VmResponse:
        code = _json_body(request).get("code")
        if not code:
            return as_json({"status": "error", "message": "Code not supplied!"}, 400)
        script = self.guest.scratch_path("python") + ".py"
        self.guest.write_file(script, str(code).encode())
        done = self.guest.run(["/usr/bin/python3", script], shell=False, timeout_s=RUN_PYTHON_TIMEOUT_S)
        self.guest.run(["rm", "-f", "--", script], shell=False, timeout_s=10)
        if done.timed_out:
            return as_json({"status": "error", "message": "Execution timeout: Code took too long to execute",
                            "error": "TimeoutExpired", "need_more": False, "output": None}, 500)
        error = done.stderr
        if done.returncode != 0 and not error:
            error = f"Process exited with code {done.returncode}"
        message = done.stdout + (f"\n{error}" if error else "")
        return as_json({"status": "success" if done.returncode == 0 else "error", "message": message,
                        "need_more": False, "output": done.stdout, "error": error, "return_code": done.returncode})

    def run_bash_script(self, request: VmRequest) -> VmResponse:
        body = _json_body(request)
        script, timeout = body.get("script"), float(body.get("timeout", RUN_BASH_TIMEOUT_S))
        if not script:
            return as_json({"status": "error", "output": "Script not supplied!", "error": "", "returncode": -1}, 400)
        workdir = body.get("working_dir")
        if workdir:
            workdir = "/home/agent" + workdir[1:] if workdir.startswith("~") else workdir
            exists = self.guest.run(["test", "-d", workdir], shell=False, timeout_s=10)
            if exists.returncode != 0:
                return as_json({"status": "error", "output": f"Working directory does not exist: {workdir}",
                                "error": "", "returncode": -1}, 400)
        if "#!/bin/bash" not in script:
            script = "#!/bin/bash\n\n" + script
        path = self.guest.scratch_path("bash") + ".sh"
        self.guest.write_file(path, script.encode())
        cd = f"cd {shlex.quote(workdir)} && " if workdir else ""
        done = self.guest.run(f"{cd}/bin/bash {path} 2>&1", shell=True, timeout_s=timeout)
        self.guest.run(["rm", "-f", "--", path], shell=False, timeout_s=10)
        if done.timed_out:
            return as_json({"status": "error", "output": f"Script execution timed out after {timeout:g} seconds",
                            "error": "", "returncode": -1}, 500)
        return as_json({"status": "success" if done.returncode == 0 else "error", "output": done.stdout,
                        "error": "", "returncode": done.returncode})

    # -- observations ------------------------------------------------------------------------------------------
    def screenshot(self, request: VmRequest) -> VmResponse:
        shot = self.guest.scratch_path("shot") + ".png"
        done = self.guest.run(["scrot", "--pointer", "--overwrite", shot], shell=False, timeout_s=30)
        if done.returncode != 0:
            raise GuestError(f"screenshot failed: {done.stderr.strip()[:300]}")
        return VmResponse(status=200, content_type="image/png", body=self.guest.take(shot, 64 << 20))

    def accessibility(self, request: VmRequest) -> VmResponse:
        return as_json({"AT": self.a11y_tree()})

    def screen_size(self, request: VmRequest) -> VmResponse:
        return as_json({"width": self.screen[0], "height": self.screen[1]})

    def cursor_position(self, request: VmRequest) -> VmResponse:
        done = self.guest.run(["xdotool", "getmouselocation", "--shell"], shell=False, timeout_s=10)
        fields = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
        if done.returncode != 0 or "X" not in fields:
            raise GuestError(f"cursor position: {done.stderr.strip()[:300]}")
        return as_json([int(fields["X"]), int(fields["Y"])])

    def platform(self, request: VmRequest) -> VmResponse:
        return text("Linux")

    def desktop_path(self, request: VmRequest) -> VmResponse:
        found = self.guest.run(["test", "-d", "/home/agent/Desktop"], shell=False, timeout_s=10)
        if found.returncode != 0:
            return as_json({"error": "Unsupported operating system or desktop path not found"}, 404)
        return as_json({"desktop_path": "/home/agent/Desktop"})

    def window_size(self, request: VmRequest) -> VmResponse:
        name = request.form.get("app_class_name")
        if not name:
            return as_json({"error": "app_class_name is required"}, 400)
        listed = self.guest.run(["wmctrl", "-l", "-x", "-G"], shell=False, timeout_s=10).stdout
        for line in listed.splitlines():
            parts = line.split(None, 7)
            if len(parts) >= 7 and name.lower() in (c.lower() for c in parts[6].split(".", 1)):
                return as_json({"width": int(parts[4]), "height": int(parts[5])})
        return as_json({"error": f"no window of class {name}"}, 404)

    def terminal(self, request: VmRequest) -> VmResponse:
        root = ElementTree.fromstring(self.a11y_tree())
        active, focused = f"{{{STATE_NS}}}active", f"{{{STATE_NS}}}focused"
        found = [terminal for app in root.iter("application") if app.get("name") == "gnome-terminal-server"
                 for frame in app.findall("frame") if frame.get(active) == "true"
                 for terminal in frame.iter("terminal") if terminal.get(focused) == "true"]
        output = found[0].text.rstrip() if len(found) == 1 and found[0].text else None
        return as_json({"output": output, "status": "success"})

    # -- files -------------------------------------------------------------------------------------------------
    def file(self, request: VmRequest) -> VmResponse:
        path = request.form.get("file_path")
        if not path:
            return as_json({"error": "file_path is required"}, 400)
        try:
            data = self.guest.read_file(path)
        except GuestError as exc:
            return as_json({"error": str(exc)}, exc.status)
        return VmResponse(status=200, content_type="application/octet-stream", body=data,
                          filename=os.path.basename(path))

    def upload(self, request: VmRequest) -> VmResponse:
        path, data = request.form.get("file_path"), request.files.get("file_data")
        if not path or data is None:
            return as_json({"error": "file_path and file_data are required"}, 400)
        try:
            self.guest.write_file(path, data)
        except GuestError as exc:
            return as_json({"error": str(exc)}, exc.status)
        return text(f"File Uploaded: {len(data)} bytes")

    def list_directory(self, request: VmRequest) -> VmResponse:
        path = _json_body(request).get("path")
        if not path:
            return as_json({"error": "Missing 'path' parameter"}, 400)
        done = self.guest.run(["/usr/bin/python3", "-I", "-c", _LIST_TREE, path], shell=False, timeout_s=60)
        if done.returncode == 3:
            return as_json({"error": "The provided path is not a directory"}, 400)
        if done.returncode != 0 or len(done.stdout) >= MAX_OUTPUT:
            raise GuestError(f"listing {path} failed: {done.stderr.strip()[-300:] or 'too large'}")
        return as_json({"directory_tree": json.loads(done.stdout)})

    # -- wallpaper, downloads, recording ---------------------------------------------------------------------------
    def wallpaper(self, request: VmRequest) -> VmResponse:
        done = self.guest.run(["gsettings", "get", "org.gnome.desktop.background", "picture-uri"], shell=False,
                              timeout_s=10)
        path = done.stdout.strip().strip("'").removeprefix("file://")
        if done.returncode != 0 or not path:
            return text("<h1>Not Found</h1><p>Wallpaper file not found</p>", 404)
        try:
            data = self.guest.read_file(path)
        except GuestError:
            return text("<h1>Internal Server Error</h1><p>Unable to serve the wallpaper file</p>", 500)
        return VmResponse(status=200, content_type="image/png", body=data)

    def change_wallpaper(self, request: VmRequest) -> VmResponse:
        path = _json_body(request).get("path")
        if not path:
            return text("Path not supplied!", 400)
        path = "/home/agent" + path[1:] if path.startswith("~") else path
        if self.guest.run(["test", "-f", path], shell=False, timeout_s=10).returncode != 0:
            return text(f"File not found: {path}", 404)
        done = self.guest.run(["gsettings", "set", "org.gnome.desktop.background", "picture-uri", f"file://{path}"],
                              shell=False, timeout_s=10)
        if done.returncode != 0:
            return text(f"Failed to change wallpaper. Error: {done.stderr.strip()[:300]}", 500)
        return text("Wallpaper changed successfully")

    def download_file(self, request: VmRequest) -> VmResponse:
        body = _json_body(request)
        if not body.get("url") or not body.get("path"):
            return text("Path or URL not supplied!", 400)
        # a workspace has no network; OSWorld's download steps are served from the engine's files cache instead
        return text(f"Failed to download {body['url']}. No retries left. Error: the workspace has no network "
                    "(files come through /setup/upload)", 500)

    def start_recording(self, request: VmRequest) -> VmResponse:
        if self.guest.run(["test", "-e", RECORDING_PID], shell=False, timeout_s=10).returncode == 0:
            return as_json({"status": "error", "message": "Recording is already in progress."}, 400)
        width, height = self.screen
        self.guest.run(["rm", "-f", "--", RECORDING], shell=False, timeout_s=10)
        self.guest.start(f"echo $$ > {RECORDING_PID}; exec ffmpeg -y -f x11grab -draw_mouse 1 -s {width}x{height} "
                         f"-i :0.0 -c:v libx264 -r 30 {RECORDING} 2> {RECORDING_LOG}", shell=True)
        time.sleep(2)
        alive = self.guest.run(["sh", "-c", f'kill -0 "$(cat {RECORDING_PID})"'], shell=False, timeout_s=10)
        if alive.returncode != 0:
            log = self.guest.run(["cat", RECORDING_LOG], shell=False, timeout_s=10).stdout[-2000:]
            self.guest.run(["rm", "-f", "--", RECORDING_PID], shell=False, timeout_s=10)
            return as_json({"status": "error", "message": "Failed to start recording. ffmpeg terminated "
                                                          f"unexpectedly. Error: {log}"}, 500)
        return as_json({"status": "success", "message": "Started recording successfully."})

    def end_recording(self, request: VmRequest) -> VmResponse:
        if self.guest.run(["test", "-e", RECORDING_PID], shell=False, timeout_s=10).returncode != 0:
            return as_json({"status": "error", "message": "No recording in progress to stop."}, 400)
        stopped = self.guest.run(f'pid=$(cat {RECORDING_PID}); rm -f {RECORDING_PID}; kill -INT "$pid"; '
                                 'for i in $(seq 150); do kill -0 "$pid" 2>/dev/null || exit 0; sleep 0.1; done; '
                                 'kill -KILL "$pid"; exit 1', shell=True, timeout_s=30)
        if stopped.returncode != 0:
            return as_json({"status": "error", "message": "Recording process was unresponsive and had to be "
                                                          "killed."}, 500)
        try:
            data = self.guest.read_file(RECORDING)
        except GuestError:
            data = b""
        if not data:
            log = self.guest.run(["cat", RECORDING_LOG], shell=False, timeout_s=10).stdout[-2000:]
            return text(f"<h1>Internal Server Error</h1><p>Recording failed. The output file is missing or empty. "
                        f"ffmpeg stderr: {log}</p>", 500)
        return VmResponse(status=200, content_type="video/mp4", body=data, filename="recording.mp4")

    # -- windows -----------------------------------------------------------------------------------------------
    def activate_window(self, request: VmRequest) -> VmResponse:
        return self._wmctrl(request, "a", "Window activated successfully")

    def close_window(self, request: VmRequest) -> VmResponse:
        return self._wmctrl(request, "c", "Window closed successfully.")

    def _wmctrl(self, request: VmRequest, action: str, answer: str) -> VmResponse:
        body = _json_body(request)
        name = body.get("window_name")
        if not name:
            return text("window_name required", 400)
        flags = "-" + ("x" if body.get("by_class") else "") + ("F" if body.get("strict") else "") + action
        self.guest.run(["wmctrl", flags, str(name)], shell=False, timeout_s=10)  # OSWorld ignores its exit code
        return text(answer)

    def open_file(self, request: VmRequest) -> VmResponse:
        body = _json_body(request)
        path = body.get("path")
        if not path:
            return text("Path not supplied!", 400)
        try:
            timeout = min(float(body.get("timeout_seconds", OPEN_FILE_LIMIT_S)), OPEN_FILE_LIMIT_S)
        except (TypeError, ValueError):
            return text(f"Invalid timeout_seconds: {body.get('timeout_seconds')}", 400)
        home_path = "/home/agent" + path[1:] if path.startswith("~") else path
        if self.guest.run(["test", "-e", home_path], shell=False, timeout_s=10).returncode == 0:
            self.guest.start(["xdg-open", home_path], shell=False)
            name = os.path.basename(home_path)
            candidates = [name, os.path.splitext(name)[0]]
        elif self.guest.run(["sh", "-c", 'command -v -- "$1"', "sh", path], shell=False, timeout_s=10).returncode == 0:
            self.guest.start([path], shell=False)
            candidates = [path]
        else:
            return text(f"Application/file not found: {path}", 404)
        if body.get("window_name"):
            candidates = [str(body["window_name"])]
        deadline = time.monotonic() + timeout
        while True:
            for line in self.guest.run(["wmctrl", "-l"], shell=False, timeout_s=10).stdout.splitlines():
                if any(candidate in line for candidate in candidates):
                    self.guest.run(["wmctrl", "-i", "-a", line.split()[0]], shell=False, timeout_s=10)
                    return text("File opened and window activated successfully")
            if time.monotonic() >= deadline:
                return text(f"Failed to find window for {candidates} within {timeout:g} seconds.", 500)
            time.sleep(0.5)


STATE_NS = "https://accessibility.ubuntu.example.org/ns/state"
RECORDING = "/tmp/recording.mp4"
RECORDING_PID = "/tmp/.bunshin-recording.pid"
RECORDING_LOG = "/tmp/.bunshin-recording.log"

# run by the image's python3 as the agent: the directory tree of argv[1] as OSWorld's JSON (exit 3: not a directory)
_LIST_TREE = """
import json, os, sys
def walk(path):
    try:
        names = os.listdir(path)
    except OSError as exc:
        return {"error": str(exc)}
    children = []
    for name in names:
        full = os.path.join(path, name)
        if os.path.isdir(full) and not os.path.islink(full):
            children.append(walk(full))
        else:
            children.append({"type": "file", "name": name})
    return {"type": "directory", "name": os.path.basename(path), "children": children}
if not os.path.isdir(sys.argv[1]):
    sys.exit(3)
json.dump(walk(sys.argv[1]), sys.stdout)
"""


OPEN_FILE_LIMIT_S = 1800.0  # OSWorld's default wait for /setup/open_file's window, and our ceiling
GRACE_S = 30.0  # beyond a route's own longest wait: the commands around it


def call_timeout_s(request: dict[str, Any]) -> float:
    """The deadline of the call that carries ``request`` (a ``VmRequest`` as a dict): its route's longest wait
    (a command's 120 s, a script's ``timeout``, a window's ``timeout_seconds``...) and some grace."""
    body = request.get("json") if isinstance(request.get("json"), dict) else {}
    path = request.get("path", "")
    try:
        if path == "/setup/open_file":
            return min(float(body.get("timeout_seconds", OPEN_FILE_LIMIT_S)), OPEN_FILE_LIMIT_S) + GRACE_S
        if path == "/run_bash_script":
            return float(body.get("timeout", RUN_BASH_TIMEOUT_S)) + GRACE_S
        if path.endswith("/execute_with_verification"):
            return EXECUTE_TIMEOUT_S + float(body.get("max_wait_time", 10)) + GRACE_S
    except (TypeError, ValueError):
        pass  # the route answers 400 for it
    return EXECUTE_TIMEOUT_S + GRACE_S


def _json_body(request: VmRequest) -> dict[str, Any]:
    if not isinstance(request.json, dict):
        raise GuestError("the request body must be a JSON object", 400)
    return request.json


def _command(command: Any, shell: bool) -> list[str] | str:
    """OSWorld's normalisation: a string without ``shell`` is split like a shell would; a list's ``~/`` elements
    are the agent's home."""
    if isinstance(command, str) and not shell:
        command = shlex.split(command)
    if isinstance(command, list):
        return ["/home/agent" + str(part)[1:] if str(part).startswith("~/") else str(part) for part in command]
    return str(command)


ROUTES: dict[tuple[str, str], Handler] = {
    ("POST", "/execute"): VmApi.execute,
    ("POST", "/setup/execute"): VmApi.execute,
    ("POST", "/execute_with_verification"): VmApi.execute_with_verification,
    ("POST", "/setup/execute_with_verification"): VmApi.execute_with_verification,
    ("POST", "/setup/launch"): VmApi.launch,
    ("POST", "/run_python"): VmApi.run_python,
    ("POST", "/run_bash_script"): VmApi.run_bash_script,
    ("GET", "/screenshot"): VmApi.screenshot,
    ("GET", "/accessibility"): VmApi.accessibility,
    ("GET", "/terminal"): VmApi.terminal,
    ("POST", "/screen_size"): VmApi.screen_size,
    ("POST", "/window_size"): VmApi.window_size,
    ("POST", "/desktop_path"): VmApi.desktop_path,
    ("POST", "/list_directory"): VmApi.list_directory,
    ("POST", "/file"): VmApi.file,
    ("POST", "/setup/upload"): VmApi.upload,
    ("GET", "/platform"): VmApi.platform,
    ("GET", "/cursor_position"): VmApi.cursor_position,
    ("POST", "/setup/activate_window"): VmApi.activate_window,
    ("POST", "/setup/close_window"): VmApi.close_window,
    ("POST", "/setup/open_file"): VmApi.open_file,
    ("POST", "/wallpaper"): VmApi.wallpaper,
    ("POST", "/setup/change_wallpaper"): VmApi.change_wallpaper,
    ("POST", "/setup/download_file"): VmApi.download_file,
    ("POST", "/start_recording"): VmApi.start_recording,
    ("POST", "/end_recording"): VmApi.end_recording,
}

"""The X desktop application of a workspace: its session, and OSWorld's VM API as one tool.

Owns: starting the desktop session when the workspace is built (``session.py``), placing the accessibility
script where only root may change it (the judge reads the tree it prints: the agent must not be able to rewrite
it), the tool ``vm`` (one VM API request in, its response out: ``vm_api.py``), and stopping the session.
A live fork cannot carry the desktop's programs (multi-threaded, an X server): a fork of this workspace is refused
here; the suite forks by replay (docs/osworld.md).
Must never: leave a session program behind when the host closes.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import msgspec

from ..app import AppContext, Tool, ToolError, WorkspaceApp
from ..records import AppSpec, Observation
from ..runtime import syscalls
from .guest import Guest, GuestError
from .session import SCREEN, DesktopSession
from .vm_api import VmApi, VmRequest

TARGET = "bunshin.envs.xdesktop.app:XDesktopApp"
GUEST_DIR = "/opt/bunshin"  # root's, in the workspace's own files: what the agent runs but cannot change
A11Y_SCRIPT = f"{GUEST_DIR}/a11y_guest.py"
A11Y_TIMEOUT_S = 60.0
# Debian's Chromium under Chrome's name; no sandbox of its own (the workspace is the sandbox: an agent's uid has no
# user namespaces to make one), no first-run questions, passwords kept in its profile, not a keyring
CHROME = ("#!/bin/sh\nexec /usr/bin/chromium --no-sandbox --no-first-run --no-default-browser-check "
          "--password-store=basic --disable-dev-shm-usage \"$@\"\n")
MAX_TREE = 32 << 20
# OSWorld's PythonController runs an action so (``python -c "import pyautogui; import time; ..."``): the same prefix
ACTION_PREFIX = "import pyautogui; import time; pyautogui.FAILSAFE = False; "
ACTION_TIMEOUT_S = 120.0
MAX_WAIT_S = 60.0
OBSERVATIONS = ("screenshot", "a11y_tree")


class XDesktopApp(WorkspaceApp):
    """``ksm``: every program of the desktop may be merged by KSM (the host opts itself in before it starts
    anything, and what it starts inherits it): a desktop is never forked live, so its pages are its own and only
    KSM can share them with another desktop's. Give the ``AppSpec`` ``merge_memory=True`` too, so that the run
    tunes ksmd while it lives (``desktop_app``)."""

    def __init__(self, screen: tuple[int, int] | list[int] = SCREEN, ksm: bool = False,
                 observe: tuple[str, ...] | list[str] = OBSERVATIONS):
        width, height = (int(v) for v in screen)
        if not (320 <= width <= 7680 and 240 <= height <= 4320):
            raise ValueError(f"screen {width}x{height}: out of 320x240..7680x4320")
        unknown = sorted(set(observe) - set(OBSERVATIONS))
        if unknown:
            raise ValueError(f"observe {unknown}: the desktop observes {list(OBSERVATIONS)}")
        self.screen = (width, height)
        self.ksm = bool(ksm)
        self.observe = tuple(observe)
        self.session: DesktopSession | None = None

    def setup(self, ctx: AppContext) -> None:
        self.ctx = ctx
        if self.ksm:
            syscalls.prctl(syscalls.PR_SET_MEMORY_MERGE, 1)
        os.makedirs(f"{GUEST_DIR}/bin", mode=0o755, exist_ok=True)
        shutil.copyfile(Path(__file__).with_name("a11y_guest.py"), A11Y_SCRIPT)
        os.chmod(A11Y_SCRIPT, 0o644)
        for name in ("google-chrome", "google-chrome-stable"):  # OSWorld's tasks launch Chrome by these names
            path = f"{GUEST_DIR}/bin/{name}"
            with open(path, "w") as script:
                script.write(CHROME)
            os.chmod(path, 0o755)
        if ctx.run_command is None:
            raise ToolError("the desktop runs in a workspace with agent commands (a worker has none)")
        self.guest = Guest(ctx.run_command)  # a command that runs over is killed alone, never the task's apps
        self.api = VmApi(self.guest, self._a11y_tree, self.screen)
        self.session = DesktopSession(ctx, ctx.run_command, self.screen)
        self.session.start()

    def tools(self) -> dict[str, Tool]:
        """``vm`` (the engine's and the judges', never offered to an agent) and the agent's tools in OSWorld's
        ``pyautogui`` action space: ``pyautogui`` (Python code, run as OSWorld's controller runs it), ``WAIT``
        (seconds) and ``observe``; each answers with the observation (``observe``: screenshot PNG in
        ``data["screenshot"]``, the accessibility tree in OSWorld's XML as the output)."""
        return {"vm": self._vm, "pyautogui": self._pyautogui, "WAIT": self._wait, "observe": self._observed}

    def _pyautogui(self, args: dict[str, Any]) -> Observation:
        code = args.get("code")
        if not isinstance(code, str) or not code.strip():
            raise ToolError("pyautogui: 'code' must be Python code (pyautogui calls)")
        done = self.guest.run(["python3", "-c", ACTION_PREFIX + code], shell=False, timeout_s=ACTION_TIMEOUT_S)
        obs = self._observation()
        if done.timed_out:
            return msgspec.structs.replace(obs, error=f"the action ran over {ACTION_TIMEOUT_S:g} s and was stopped")
        if done.returncode != 0:
            return msgspec.structs.replace(obs, exit_code=done.returncode,
                                           error=f"the action failed: {done.stderr.strip()[-1500:]}")
        return msgspec.structs.replace(obs, exit_code=0)

    def _wait(self, args: dict[str, Any]) -> Observation:
        seconds = args.get("seconds", 1.0)
        if not isinstance(seconds, int | float) or not 0 <= seconds <= MAX_WAIT_S:
            raise ToolError(f"WAIT: seconds must be a number in 0..{MAX_WAIT_S:g}")
        time.sleep(float(seconds))
        return self._observation()

    def _observed(self, args: dict[str, Any]) -> Observation:
        return self._observation()

    def _observation(self) -> Observation:
        data: dict[str, Any] = {}
        output = ""
        try:
            if "screenshot" in self.observe:
                data["screenshot"] = self.api.screenshot(VmRequest(method="GET", path="/screenshot")).body
            if "a11y_tree" in self.observe:
                output = self._a11y_tree()
        except GuestError as exc:
            raise ToolError(f"observing the desktop: {exc}") from exc
        return Observation(output=output, data=data)

    def _vm(self, args: dict[str, Any]) -> Observation:
        """One request to OSWorld's VM API: ``args`` is a ``VmRequest`` (method, path, json, form, files)."""
        try:
            request = msgspec.convert(args, VmRequest)
        except msgspec.ValidationError as exc:
            raise ToolError(f"vm: not a VM API request: {exc}") from exc
        response = self.api.handle(request)
        return Observation(output=f"{response.status} {request.method} {request.path}",
                           data=msgspec.to_builtins(response, builtin_types=(bytes,)))

    def _a11y_tree(self) -> str:
        out = self.guest.scratch_path("a11y") + ".xml"
        # isolated (-I): no user site-packages, no PYTHON* variables: a module the agent planted in its home is
        # never what builds the tree the judge reads
        done = self.guest.run(["/usr/bin/python3", "-I", A11Y_SCRIPT, out], shell=False, timeout_s=A11Y_TIMEOUT_S)
        if done.returncode != 0:
            raise GuestError(f"accessibility tree: {done.stderr.strip()[-500:] or 'timed out'}")
        return self.guest.take(out, MAX_TREE).decode("utf-8", "replace")

    def before_fork(self, ctx: AppContext) -> None:
        raise ToolError("a workspace with a real desktop cannot be forked live by this backend (its programs are "
                        "multi-threaded and an X server); the tree fork (--backend kmod) forks it, every program "
                        "of it")

    def close(self) -> None:
        if self.session is not None:
            self.session.stop()
            self.session = None


def desktop_app(*, ksm: bool = False, screen: tuple[int, int] = SCREEN,
                observe: tuple[str, ...] | list[str] = OBSERVATIONS) -> AppSpec:
    """The ``AppSpec`` of a desktop workspace on the image ``desktop`` (with ``ksm``, its programs opt into KSM and
    the run tunes ksmd while it lives; ``observe``: what each agent tool answers with)."""
    return AppSpec(target=TARGET, kwargs={"ksm": ksm, "screen": list(screen), "observe": list(observe)},
                   merge_memory=ksm, image="desktop")

"""The desktop session of a workspace: the display server, the D-Bus session bus and the window manager.

Owns: starting them as application processes (as the agent user, each the PID 1 of its own PID namespace, dying
with the host, never killed by an agent command's timeout), waiting until each answers, the environment every
desktop program and agent command of the session gets (``ENV``), the home as OSWorld's VM has it (``/home/user``
the same directory as the agent's home; VLC's configuration file written by VLC), and stopping them. AT-SPI is
started by the session bus on an app's first request (D-Bus activation), under the bus's process.
Why abstract sockets: the display (``@/tmp/.X11-unix/X0``) and the bus (``@bunshin-session-bus``) are reached
through the workspace's network namespace, whatever mount namespace a program has; the accessibility bus's socket
is under XDG_RUNTIME_DIR, a directory of the workspace's own files that every program sees.
Must never: leave a session program running after ``stop`` or the host's death.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

from ..app import AppContext, ToolError
from ..records import Observation
from ..runtime.image import AGENT_GID, AGENT_HOME, AGENT_UID

OSWORLD_HOME = "/home/user"  # the home of OSWorld's VM user, which its task files write out in full

SCREEN = (1920, 1080)
DISPLAY = ":0"
X_SOCKET = "\0/tmp/.X11-unix/X0"
BUS_NAME = "bunshin-session-bus"
RUNTIME_DIR = f"/run/user/{AGENT_UID}"
ENV = {
    "DISPLAY": DISPLAY,
    "DBUS_SESSION_BUS_ADDRESS": f"unix:abstract={BUS_NAME}",
    "XDG_RUNTIME_DIR": RUNTIME_DIR,
    "HOME": AGENT_HOME,
    "USER": "agent",
    "LOGNAME": "agent",
    "PATH": "/opt/bunshin/bin:/usr/local/bin:/usr/bin:/bin",  # /opt/bunshin/bin: google-chrome (app.py)
    "LANG": "C.UTF-8",
    "TZ": "UTC",
    "SHELL": "/bin/bash",
    "XDG_SESSION_TYPE": "x11",  # what an X login sets; pyscreeze (pyautogui.screenshot) takes scrot only then
    "SAL_USE_VCLPLUGIN": "gtk3",  # LibreOffice's GTK 3 front end: the one that speaks AT-SPI
    "NO_AT_BRIDGE": "0",
}
READY_TIMEOUT_S = 30.0


def session_exports() -> str:
    """The session's environment as a shell prefix for agent commands (``export K='v' ...;``)."""
    return "export " + " ".join(f"{key}='{value}'" for key, value in ENV.items()) + "; "


class DesktopSession:
    """One workspace's session programs, started by ``start`` and stopped by ``stop``."""

    def __init__(self, ctx: AppContext, run: Callable[[str, float], Observation], screen: tuple[int, int] = SCREEN):
        """``run(cmd, timeout_s)``: a command of the session's as the agent user (``AppContext.run_command``)."""
        self.ctx = ctx
        self._run = run
        self.screen = screen
        self.processes: list[Any] = []

    def start(self) -> None:
        """Start the display, the bus and the window manager, each once the one before answers."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        os.makedirs(RUNTIME_DIR, mode=0o700, exist_ok=True)
        os.chown(RUNTIME_DIR, AGENT_UID, AGENT_GID)
        os.makedirs(f"{AGENT_HOME}/Desktop", exist_ok=True)
        os.chown(f"{AGENT_HOME}/Desktop", AGENT_UID, AGENT_GID)
        if not os.path.lexists(OSWORLD_HOME):  # OSWorld's tasks name the VM user's home: the same directory here
            os.symlink(AGENT_HOME, OSWORLD_HOME)
        width, height = self.screen
        self._launch("xvfb", ["/usr/bin/Xvfb", DISPLAY, "-screen", "0", f"{width}x{height}x24", "-nolisten", "tcp",
                              "-dpi", "96", "+extension", "RANDR"])
        self._wait_ready(X_SOCKET, "the display (Xvfb)", deadline, _x_answers)
        self._launch("dbus", ["/usr/bin/dbus-daemon", "--session", "--nofork", "--nopidfile",
                              f"--address=unix:abstract={BUS_NAME}"])
        self._wait_ready("\0" + BUS_NAME, "the session bus (dbus-daemon)", deadline, lambda sock: True)
        openbox = self._launch("openbox", ["/usr/bin/openbox"])
        starts = 1
        while True:
            if self._run(session_exports() + "wmctrl -m >/dev/null 2>&1", 5).exit_code == 0:
                # VLC's configuration file, as a VM where VLC has run has it (OSWorld's vlc_config getter reads
                # it): written in the background by VLC itself, every option at its default but the first-run
                # privacy question, answered (as in OSWorld's VM)
                self._run(session_exports() + "cd ~; (setsid sh -c 'vlc -I dummy --no-video "
                          "--reset-config vlc://quit; sed -i \"s/^#qt-privacy-ask=1$/qt-privacy-ask=0/\" "
                          ".config/vlc/vlcrc' </dev/null >/dev/null 2>&1 &)", 10)
                return
            if openbox.proc.poll() is not None and starts < 3:  # it gave up on a display still settling: again
                self.processes.remove(openbox)
                openbox.kill()
                openbox = self._launch("openbox", ["/usr/bin/openbox"])
                starts += 1
            if time.monotonic() > deadline:
                raise ToolError(f"the window manager (openbox) did not answer within {READY_TIMEOUT_S:g} s: "
                                f"{self._logs()}")
            time.sleep(0.05)

    def _launch(self, name: str, argv: list[str]) -> Any:
        process = self.ctx.launch(name, argv, env=ENV)
        self.processes.append(process)
        return process

    def _wait_ready(self, address: str, what: str, deadline: float, answers: Callable[[socket.socket], bool]) -> None:
        """Until ``address`` accepts a connection on which ``answers`` holds."""
        while True:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.settimeout(2)
                try:
                    probe.connect(address)
                    if answers(probe):
                        return
                except OSError:
                    pass
            if any(p.proc.poll() is not None for p in self.processes):
                raise ToolError(f"{what} exited while starting: {self._logs()}")
            if time.monotonic() > deadline:
                raise ToolError(f"{what} did not answer within {READY_TIMEOUT_S:g} s: {self._logs()}")
            time.sleep(0.02)

    def _logs(self) -> str:
        return "; ".join(f"{p.name}: {p.log_tail(600).strip()!r}" for p in self.processes)

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.kill()
        self.processes = []


def _x_answers(sock: socket.socket) -> bool:
    """Whether the X server on ``sock`` accepts a client: its answer to X11's connection set-up (no authorisation,
    little-endian) starts with 1, success."""
    sock.sendall(b"l\x00" + struct.pack("<HHHH", 11, 0, 0, 0) + b"\x00\x00")
    return sock.recv(8)[:1] == b"\x01"

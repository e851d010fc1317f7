"""A Docker daemon to talk to: the one that answers, or one started for a while and stopped afterwards.

Owns: asking whether a daemon answers (``ping``), and ``daemon_running``: a context (blocking) in which one answers, starting
``dockerd`` when none does (no bridge, no iptables rules: workspaces' containers have no network) and stopping
exactly what it started, on every path; the declared images' names in Docker (``bunshin/<name>:<digest>``) and
importing them (``import_declared``).
Must never: stop a daemon it did not start, or leave one it started running.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from .docker_roots import DEFAULT_SOCKET, DockerRef, DockerUnavailable, Progress, import_root
from .store import BuiltImage, stop_group

START_TIMEOUT_S = 60.0
DOCKER_REPO = "bunshin"


def answers(address: str | None = None, timeout_s: float = 2.0) -> bool:
    """Whether a daemon answers ``/_ping`` on the Unix socket ``address`` (blocking, at most ``timeout_s``; a
    plain request, so that it serves a fixture and an event loop alike)."""
    path = (address or DEFAULT_SOCKET).removeprefix("unix://")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(path)
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            return _ok(sock)
    except OSError:
        return False


@contextlib.contextmanager
def daemon_running(log_path: Path, *, address: str | None = None,
                   timeout_s: float = START_TIMEOUT_S) -> Iterator[bool]:
    """A daemon answers at ``address`` inside the block; yields whether this context started it (and so stops it
    on leaving, however it is left). ``DockerUnavailable`` when none answers and ``dockerd`` is missing or does
    not come up within ``timeout_s`` (the message ends with its log's last lines). Blocking."""
    address = address or DEFAULT_SOCKET
    if answers(address):
        yield False
        return
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise DockerUnavailable(address, "no dockerd on this machine")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [dockerd, "--host", address, "--pidfile", str(log_path.with_suffix(".pid")), "--bridge=none",
             "--iptables=false", "--ip-masq=false"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while not answers(address):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
                raise DockerUnavailable(address, f"dockerd {'exited' if proc.poll() is not None else 'timed out'}: "
                                                 + " | ".join(tail))
            time.sleep(0.2)
        yield True
    finally:
        _stop(proc, address.removeprefix("unix://"))


def _ok(sock: socket.socket) -> bool:
    answer = b""
    while chunk := sock.recv(4096):
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return head.startswith(b"HTTP/1.") and head.split(b" ", 2)[1:2] == [b"200"] and body.strip() == b"OK"


def _stop(proc: subprocess.Popen[bytes], socket_path: str) -> None:
    """dockerd's group stopped (on SIGTERM it stops its containers and cleans its mounts; SIGKILL after a minute),
    its socket removed."""
    if proc.poll() is None:
        stop_group(proc, timeout_s=60.0)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)


def declared_ref(built: BuiltImage) -> DockerRef:
    """The Docker name of a declared image as built here: its recipe's name, tagged with its digest."""
    return DockerRef(f"{DOCKER_REPO}/{built.name}:{built.path.name.rsplit('-', 1)[-1]}")


async def import_declared(built: BuiltImage, *, address: str | None = None,
                          progress: Progress = lambda line: None) -> DockerRef:
    """``built`` as a Docker image (``declared_ref``), imported unless the daemon has it; its name."""
    ref = declared_ref(built)
    name, tag = ref.name.rsplit(":", 1)
    await import_root(built.root, name, tag, address=address, progress=progress)
    return ref

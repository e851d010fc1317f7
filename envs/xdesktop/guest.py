"""What the desktop's VM API does inside the workspace, as the agent user: commands, files, programs left running.

Owns: running a command in the desktop session as the agent (its standard output and error apart, each bounded,
under a deadline), starting a program and not waiting for it, and moving files' bytes in and out with the agent's
permissions (never the host's: a path the agent controls may be a symlink to a file only root may read).
Why files go through the agent's own ``cat``: the host runs as root in the workspace; a read or write it did
itself would follow the agent's symlinks with root's rights. The bytes cross in a file of the session's runtime
directory that the host opens without following links and checks is the agent's.
Must never: read or write a file the agent could not; return more than the bounds say.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import stat
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import EnvsError
from ..records import Observation
from ..runtime.image import AGENT_UID
from .session import RUNTIME_DIR, session_exports

MAX_OUTPUT = 1 << 20  # of a command's stdout, and of its stderr
MAX_FILE = 256 << 20  # a file read or written through the API


class GuestError(EnvsError):
    """A guest operation failed; ``status`` is the HTTP status the VM API answers with."""

    def __init__(self, message: str, status: int = 500):
        super().__init__(message)
        self.status = status


@dataclass
class Completed:
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False


class Guest:
    """The agent's side of the workspace. ``run_agent(cmd, timeout_s)``: the host's agent command runner."""

    def __init__(self, run_agent: Callable[[str, float], Observation]):
        self.run_agent = run_agent

    def run(self, argv_or_script: list[str] | str, *, shell: bool, timeout_s: float,
            stdin_path: str | None = None) -> Completed:
        """Run a command as the agent in the session (a list of arguments, or with ``shell`` a script: a list's
        first element is then the script and the rest its ``$0``...), stdout and stderr captured apart."""
        if shell:
            if isinstance(argv_or_script, list):
                script, rest = (argv_or_script[0], argv_or_script[1:]) if argv_or_script else ("", [])
                command = "sh -c " + " ".join(shlex.quote(part) for part in [script, *rest])
            else:
                command = "sh -c " + shlex.quote(argv_or_script)
        else:
            if not isinstance(argv_or_script, list) or not argv_or_script:
                raise GuestError("an empty command")
            command = " ".join(shlex.quote(part) for part in argv_or_script)
        out, err = self.scratch_path("out"), self.scratch_path("err")
        redirect = f" <{shlex.quote(stdin_path)}" if stdin_path else " </dev/null"
        obs = self.run_agent(f"{session_exports()}cd ~; {command}{redirect} >{out} 2>{err}; echo $?", timeout_s)
        try:
            stdout = self.take(out, MAX_OUTPUT).decode("utf-8", "replace")
            stderr = self.take(err, MAX_OUTPUT).decode("utf-8", "replace")
        except GuestError:
            stdout = stderr = ""
        if obs.error is not None:  # the runtime's deadline: the command was killed
            return Completed(-9, stdout, stderr, timed_out=True)
        code = obs.output.strip().splitlines()[-1:] or [""]
        return Completed(int(code[0]) if code[0].lstrip("-").isdigit() else -1, stdout, stderr)

    def start(self, argv_or_script: list[str] | str, *, shell: bool) -> None:
        """Start a program in the session and do not wait for it (its output goes nowhere)."""
        if shell:
            script = argv_or_script if isinstance(argv_or_script, str) else " ".join(argv_or_script)
            command = "sh -c " + shlex.quote(script)
        else:
            assert isinstance(argv_or_script, list)
            command = " ".join(shlex.quote(part) for part in argv_or_script)
        obs = self.run_agent(f"{session_exports()}cd ~; (setsid {command} </dev/null >/dev/null 2>&1 &)", 10)
        if obs.exit_code != 0:
            raise GuestError(f"could not start {argv_or_script!r}: {obs.output.strip()[:500]}")

    def read_file(self, path: str, limit: int = MAX_FILE) -> bytes:
        """The bytes of ``path`` as the agent can read it (``~`` is the agent's home). GuestError 404 if it is
        not a readable file."""
        scratch = self.scratch_path("file")
        quoted = _home(path)
        done = self.run_agent(f"test -f {quoted} || exit 3; head -c {limit + 1} -- {quoted} >{scratch}", 60)
        if done.exit_code == 3:
            self._discard(scratch)
            raise GuestError("File not found", 404)
        if done.exit_code != 0:
            self._discard(scratch)
            raise GuestError(f"Failed to serve file: {done.output.strip()[:300] or done.error}")
        data = self.take(scratch, limit + 1)
        if len(data) > limit:
            raise GuestError(f"Failed to serve file: larger than {limit} bytes")
        return data

    def write_file(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` as the agent, making its parent directories."""
        if len(data) > MAX_FILE:
            raise GuestError(f"Failed to upload file: larger than {MAX_FILE} bytes", 413)
        scratch = self.scratch_path("upload")
        fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.fchown(fd, AGENT_UID, AGENT_UID)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        quoted = _home(path)
        done = self.run_agent(f'mkdir -p -- "$(dirname -- {quoted})" && cat -- {scratch} > {quoted}; s=$?; '
                              f"rm -f -- {scratch}; exit $s", 60)
        if done.exit_code != 0:
            raise GuestError(f"Failed to upload file: {done.output.strip()[:300] or done.error}")

    # -- the scratch files the bytes cross in ------------------------------------------------------------------
    def scratch_path(self, kind: str) -> str:
        """A fresh path in the session's runtime directory for bytes to cross in (``take`` reads it back)."""
        return f"{RUNTIME_DIR}/.vm-{kind}-{secrets.token_hex(6)}"

    def take(self, path: str, limit: int) -> bytes:
        """Read (at most ``limit`` bytes) and remove a scratch file the agent's command wrote: opened without
        following links, and only if it is a regular file of the agent's."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            return b""
        except OSError as exc:
            raise GuestError(f"{path}: {exc}") from exc
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != AGENT_UID:
                raise GuestError(f"{path}: not a file of the agent's")
            chunks, left = [], limit
            while left > 0:
                chunk = os.read(fd, min(left, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)
            self._discard(path)

    @staticmethod
    def _discard(path: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _home(path: str) -> str:
    """``path`` quoted for the shell, with a leading ``~`` the agent's home."""
    if path == "~" or path.startswith("~/"):
        return '"$HOME"' + shlex.quote(path[1:]) if len(path) > 1 else '"$HOME"'
    return shlex.quote(path)

"""Running the tree-fork builder (``kmod/treefork/builder.c``) on a plan: the clone is built, every process grafted
and held, then released at once (after the caller, say, froze the clone's cgroup to compare it with its source).

Owns: ``TreeForkBuild`` (one build: start, wait until grafted, release or abort, the clone's init, kill) and the
deadlines on each of those. Freezing the source and making the clone's root and cgroup are the caller's.
Must never: leave a half-built clone: every failure, timeout or abort kills the builder's pid namespace.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from .errors import TreeForkFailed
from .plan import TreePlan, render


class BuilderSilent(TreeForkFailed):
    """The builder said nothing more (it ended, or its deadline passed)."""


class BuilderLines:
    """The builder's report lines on ``fd`` (its standard output): "grafted N MS", "released MS", or
    "error PID ERRNO WHAT", which raises ``TreeForkFailed``."""

    def __init__(self, fd: int):
        self.fd = fd
        self._buffer = b""

    def next(self, expected: str, deadline: float) -> str:
        """The next line, which must start with ``expected``; ``BuilderSilent`` if none comes before
        ``deadline`` (monotonic) or the builder ended."""
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                raise BuilderSilent(0, 0, f"no {expected!r} from the builder in time")
            chunk = os.read(self.fd, 4096)
            if not chunk:
                raise BuilderSilent(0, 0, f"the builder ended before {expected!r}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        text = line.decode(errors="replace")
        if text.startswith("error "):
            _, pid, errno, what = text.split(" ", 3)
            raise TreeForkFailed(int(pid), int(errno), what)
        if not text.startswith(expected):
            raise TreeForkFailed(0, 0, f"unexpected line from the builder: {text!r}")
        return text


class TreeForkBuild:
    """One run of the builder. ``grafted_ms`` and ``released_ms`` are the builder's own clock from its start."""

    def __init__(self, plan: TreePlan, builder: str | Path, timeout_s: float = 60.0, fault: str = "",
                 fault_pid: int = 1, pass_fds: tuple[int, ...] = ()):
        """``fault`` (``WHO:STEP``, tests only) kills the builder, the helper of clone pid ``fault_pid``, the
        source or the engine (this process) at a named step (see ``builder.c``). ``pass_fds``: the descriptors
        the plan's ``inherit`` objects name, passed to the builder at their numbers."""
        self.plan = plan
        self.timeout_s = timeout_s
        self.started = time.monotonic()
        self.grafted_ms = self.released_ms = 0.0
        # its steps go to a file: a pipe nobody reads would fill and stop a large build
        self._trace = tempfile.TemporaryFile()  # noqa: SIM115 (closed by kill)
        # the builder dies with the thread that starts it (PR_SET_PDEATHSIG), and the clone with the builder: the
        # caller's thread must live as long as the clone
        env = dict(os.environ, BUNSHIN_TREEFORK_ENGINE=str(os.getpid()))
        if fault:
            env.update(BUNSHIN_TREEFORK_FAULT=fault, BUNSHIN_TREEFORK_FAULT_PID=str(fault_pid))
        self.proc = subprocess.Popen([str(builder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._trace, start_new_session=True, env=env, pass_fds=pass_fds)
        assert self.proc.stdout is not None
        self._lines = BuilderLines(self.proc.stdout.fileno())
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(render(plan).encode())
            self.proc.stdin.flush()
            words = self._line("grafted").split()
            self.grafted_ms = float(words[2])
        except BaseException:
            self.kill()
            raise

    def _line(self, expected: str) -> str:
        """The builder's next line, which must start with ``expected`` (an ``error`` line raises)."""
        assert self.proc.stdout is not None
        try:
            return self._lines.next(expected, self.started + self.timeout_s)
        except BuilderSilent as exc:
            raise TreeForkFailed(0, 0, f"{exc}; its last steps: {self._steps()}") from None

    def _steps(self) -> str:
        """Where the clone's first process and its threads are in the kernel, and the builder's stderr (its steps),
        after killing it."""
        where = []
        with contextlib.suppress(OSError, TreeForkFailed):
            init = self.init_pid
            for tid in sorted(os.listdir(f"/proc/{init}/task"), key=int):
                stack = Path(f"/proc/{init}/task/{tid}/stack").read_text().split()[1::2][:6]
                where.append(f"thread {tid}: {' < '.join(stack)}")
        self.kill_processes()
        self._trace.seek(0)
        return "\n".join(where) + "\n" + self._trace.read().decode(errors="replace")[-3000:]

    @property
    def init_pid(self) -> int:
        """The clone's pid 1, as we see it (the builder's one child)."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        if len(children) != 1:
            raise TreeForkFailed(0, 0, f"the builder has {len(children)} children, not the clone's init")
        return int(children[0])

    def release(self) -> None:
        """Let every clone process run (from the instruction its source stopped at)."""
        assert self.proc.stdin is not None
        try:
            try:
                self.proc.stdin.write(b"release\n")
                self.proc.stdin.close()
            except BrokenPipeError:
                raise TreeForkFailed(0, 0, f"the builder ended before the release: {self._steps()}") from None
            self.released_ms = float(self._line("released").split()[1])
        except BaseException:
            self.kill()
            raise

    def kill(self) -> None:
        """Kill the clone (its pid namespace's init, so every process of it) and reap the builder."""
        self.kill_processes()
        for stream in (self.proc.stdin, self.proc.stdout, self._trace):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def kill_processes(self) -> None:
        if self.proc.poll() is None:
            try:
                init = self.init_pid
            except (OSError, TreeForkFailed):
                init = 0
            if init:
                with contextlib.suppress(OSError):
                    os.kill(init, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

"""The desktop's terminal: a shell session whose scrollback is kept, with a working directory that persists
between commands as in a real terminal.

Owns: the scrollback (prompt, command and output of every command, bounded by ``scrollback_lines``), the session's
current directory (each command runs in a fresh ``/bin/sh`` as the agent user, started in that directory; the
directory it ends in is reported back through a marker line the terminal strips), and the output of the last
command.
Must never: show the marker to the agent.
"""

from __future__ import annotations

import shlex

from ..runtime.image import AGENT_HOME

MARKER = "\x1e__bunshin_cwd__:"


class Terminal:
    def __init__(self, scrollback_lines: int = 10_000):
        self.scrollback: list[str] = []
        self.scrollback_lines = scrollback_lines
        self.cwd = AGENT_HOME
        self.last_output = ""
        self.commands = 0

    @property
    def prompt(self) -> str:
        where = "~" + self.cwd[len(AGENT_HOME):] if self.cwd.startswith(AGENT_HOME) else self.cwd
        return f"agent@desktop:{where}$ "

    def wrap(self, command: str) -> str:
        """The shell script that runs ``command`` in the session's directory and reports where it ended."""
        return (f"cd {shlex.quote(self.cwd)} 2>/dev/null || cd\n{command}\n"
                f"__rc=$?; printf '\\n{MARKER}%s\\n' \"$PWD\"; exit $__rc")

    def record(self, command: str, raw_output: str) -> str:
        """Strip the marker from ``raw_output``, update the directory, append to the scrollback; the output."""
        output = raw_output
        idx = raw_output.rfind("\n" + MARKER)
        if idx >= 0:
            rest = raw_output[idx + 1 + len(MARKER):]
            cwd = rest.split("\n", 1)[0]
            if cwd.startswith("/"):
                self.cwd = cwd
            output = raw_output[:idx]
        self.last_output = output
        self.commands += 1
        self.append(self.prompt_before + command)
        if output:
            self.append(output.rstrip("\n"))
        return output

    prompt_before = ""

    def begin(self) -> None:
        self.prompt_before = self.prompt

    def append(self, text: str) -> None:
        self.scrollback.extend(text.split("\n"))
        over = len(self.scrollback) - self.scrollback_lines
        if over > 0:
            del self.scrollback[:over]

    @property
    def text(self) -> str:
        return "\n".join(self.scrollback)

# SPDX-License-Identifier: GPL-2.0
"""A workload for the tree fork (`treefork: pty`): a terminal, as a terminal emulator is one. Pid 1 holds a pty's
master and runs an interactive bash (job control on) on its slave, bash the leader of a session whose controlling
terminal the pty is. It appends what bash and its jobs write to /tmp/screen and types the bytes of /tmp/keys (then
removes it: the harness writes it whole, by rename).

    python3 pty_app.py
"""

import os
import pty
import select


def main() -> None:
    pid, master = pty.fork()
    if pid == 0:  # the session's leader, the pty its controlling terminal (login_tty)
        os.environ.update(PS1="$ ", TERM="dumb", HOME="/tmp")
        os.execv("/bin/bash", ["bash", "--norc", "--noprofile", "-i"])
    screen = os.open("/tmp/screen", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    while True:
        if select.select([master], [], [], 0.05)[0]:
            try:
                os.write(screen, os.read(master, 4096))
            except OSError:  # EIO: bash and every job are gone
                return
        try:
            with open("/tmp/keys", "rb") as f:
                keys = f.read()
            os.unlink("/tmp/keys")
        except FileNotFoundError:
            continue
        os.write(master, keys)


if __name__ == "__main__":
    main()

"""Builds a minimal root file system from the host's own binaries (a shell, coreutils, their libraries), for tests
that give the runtime an image directory or tarball instead of the default."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

PROGRAMS = ["/bin/sh", "/bin/cat", "/bin/ls", "/bin/echo", "/usr/bin/id", "/bin/hostname", "/bin/sleep"]


def _libraries(program: str) -> set[str]:
    out = subprocess.run(["ldd", program], capture_output=True, text=True).stdout
    return {tok for line in out.splitlines() for tok in line.split() if tok.startswith("/")}


def build_minimal_rootfs(dest: Path, marker: str) -> Path:
    dest.mkdir(parents=True)
    for sub in ("usr/bin", "usr/lib", "usr/lib64", "usr/sbin", "etc"):
        (dest / sub).mkdir(parents=True)
    for link in ("bin", "lib", "lib64", "sbin"):
        os.symlink(f"usr/{link}", dest / link)
    files = set(PROGRAMS)
    for program in PROGRAMS + [sys.executable]:
        files |= {lib for lib in _libraries(program) if lib.startswith(("/lib", "/usr/"))}
    for path in sorted(files):
        target = dest / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(path), target)
    (dest / "etc/passwd").write_text("root:x:0:0::/root:/bin/sh\nagent:x:65000:65000::/home/agent:/bin/sh\n")
    (dest / "etc/group").write_text("root:x:0:\nagent:x:65000:\n")
    (dest / "etc/image-marker").write_text(marker + "\n")
    return dest

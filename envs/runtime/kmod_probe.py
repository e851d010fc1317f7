"""Whether BunshinFork's kernel module (``kmod/``) can load on this host, for ``bunshin doctor``.

Owns: the verdict, from what the host shows without loading anything: module support (/proc/modules), the kernel
release (the module is built for Linux 6.1 LTS, Debian 12's kernel), its headers, and the non-exported kernel
symbols the module resolves at load time (read from ``kmod/symbols.c``, the one list, and looked up in
/proc/kallsyms). Where the module cannot load, the verdict says that ``kmod/vmtest`` is how it is tested: Debian's
6.1 kernel booted under QEMU.
Must never: load, build or unload anything.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

KMOD_DIR = Path(__file__).resolve().parents[2] / "kmod"
VM_HARNESS = "tested in a VM instead: kmod/vmtest boots Debian's 6.1 kernel under QEMU and runs the selftests there"
TARGET = (6, 1)


@dataclass(frozen=True)
class KmodVerdict:
    can_load: bool
    loaded: bool
    detail: str


def required_symbols(symbols_c: Path = KMOD_DIR / "symbols.c") -> list[str]:
    """The kernel symbols the module looks up by name (kallsyms_lookup_name itself is found through a kprobe, and
    kallsyms_on_each_match_symbol checks that each name is unique)."""
    try:
        text = symbols_c.read_text()
    except OSError:
        return []
    return ["kallsyms_lookup_name", "kallsyms_on_each_match_symbol",
            *re.findall(r'BUNSHIN_SYM\(\w+, "(\w+)"\)', text)]


def kallsyms_names(path: str = "/proc/kallsyms") -> set[str]:
    names: set[str] = set()
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3:
                    names.add(parts[2])
    except OSError:
        pass
    return names


def judge(*, modules: bool, release: str, headers: bool, missing: list[str], loaded: bool) -> KmodVerdict:
    """The verdict from what the host shows (a pure function, so each case is testable on any host)."""
    if loaded:
        return KmodVerdict(True, True, "loaded (/dev/bunshin)")
    version = tuple(int(x) for x in re.findall(r"\d+", release)[:2])
    if not modules:
        why = f"kernel {release} is built without loadable modules"
    elif version != TARGET:
        why = f"the module is built for Linux 6.1 LTS and this kernel is {release}"
    elif missing:
        why = f"kernel symbol{'s' if len(missing) > 1 else ''} {', '.join(missing)} not in /proc/kallsyms"
    elif not headers:
        why = f"no headers to build against (apt-get install linux-headers-{release})"
    else:
        return KmodVerdict(True, False, f"can load: make -C kmod KDIR=/lib/modules/{release}/build && "
                                        "insmod kmod/bunshin.ko")
    return KmodVerdict(False, False, f"cannot load here: {why}; {VM_HARNESS}")


def probe() -> KmodVerdict:
    release = os.uname().release
    modules = os.path.exists("/proc/modules")
    missing: list[str] = []
    if modules:
        names = kallsyms_names()
        missing = [s for s in required_symbols() if s not in names]
    return judge(modules=modules, release=release, headers=os.path.exists(f"/lib/modules/{release}/build/Makefile"),
                 missing=missing, loaded=os.path.exists("/sys/module/bunshin"))

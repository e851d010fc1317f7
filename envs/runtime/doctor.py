"""What this host supports, and so which fork backends can run here (``bunshin doctor``).

Owns: probing the kernel and the machine without changing them (namespaces are tried in a throw-away child),
and the verdict per backend.
Must never: leave anything behind, or need anything beyond the standard library and /proc, /sys.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from . import kmod_probe, ksm
from .cgroups import CgroupLayout, CgroupUnavailable
from .fork.kmod import builder_path
from .fork.kmod import unavailable as kmod_unavailable


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)
    backends: dict[str, tuple[bool, str]] = field(default_factory=dict)

    def ok(self, name: str) -> bool:
        return any(c.ok for c in self.checks if c.name == name)

    def to_json(self) -> dict[str, object]:
        return {
            "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in self.checks],
            "backends": {k: {"available": v[0], "detail": v[1]} for k, v in self.backends.items()},
        }


def _try_unshare(flag: str) -> Check:
    if shutil.which("unshare") is None:
        return Check(f"namespace {flag}", False, "unshare(1) not found (util-linux)")
    args = ["unshare", f"--{flag}"] + (["--fork"] if flag == "pid" else []) + ["true"]
    proc = subprocess.run(args, capture_output=True, text=True)
    return Check(f"namespace {flag}", proc.returncode == 0, proc.stderr.strip() or "works")


def _filesystems() -> set[str]:
    return {line.split()[-1] for line in Path("/proc/filesystems").read_text().splitlines() if line.strip()}


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _ksm() -> Check:
    """KSM, which ``--ksm on`` has Chromium workspaces opt into: ksmd's settings now, what it has merged, and
    whether a run of ours holds its tuning (``ksm.py``)."""
    if not ksm.available():
        return Check("KSM", False, "absent (kernel without CONFIG_KSM): --ksm on merges nothing")
    settings, counters = ksm.read_settings(), ksm.read_counters()
    detail = " ".join(f"{k}={v}" for k, v in settings.items())
    detail += f"; pages_sharing={counters.get('pages_sharing', 0)}, full_scans={counters.get('full_scans', 0)}"
    holders = ksm.holders()
    detail += f"; tuned by bunshin runs {', '.join(holders)}" if holders else "; the host's own settings"
    return Check("KSM", True, detail + f"; --ksm on tunes run=1 pages_to_scan={ksm.KsmTuning().pages_to_scan} "
                 f"sleep_millisecs={ksm.KsmTuning().sleep_millisecs} while its workspaces run")


def _chromium() -> Check:
    """Debian's Chromium, which ``--browser chromium`` runs in every workspace: the one in the declared image
    ``chromium`` (its version as the image's manifest records it), never the host's."""
    from ..images.recipes import recipe
    from ..images.store import ImageStore

    built = ImageStore().find(recipe("chromium"))
    if built is None:
        return Check("chromium", False, "image chromium not built (bunshin images build chromium; scripts/setup.sh "
                     "builds it)")
    return Check("chromium", True, f"chromium {built.manifest.packages.get('chromium', '?')} in image chromium "
                 f"({built.path.name})")


def _cgroup_v2(report: Report) -> bool:
    return any(c.name == "cgroups" and c.ok and c.detail.startswith("v2") for c in report.checks)


def diagnose() -> Report:
    report = Report()
    add = report.checks.append
    add(Check("root", os.geteuid() == 0, f"euid {os.geteuid()}"))
    for flag in ("mount", "net", "uts", "ipc", "pid", "user"):
        add(_try_unshare(flag))
    fs = _filesystems()
    add(Check("overlayfs", "overlay" in fs, "in /proc/filesystems" if "overlay" in fs else "missing"))
    mkfs = shutil.which("mkfs.btrfs")
    add(Check("btrfs", "btrfs" in fs and mkfs is not None,
              f"kernel {'has' if 'btrfs' in fs else 'lacks'} btrfs; mkfs.btrfs {'at ' + mkfs if mkfs else 'missing'}"))
    try:
        layout = CgroupLayout.detect()
        add(Check("cgroups", True, f"v{layout.version}: " + ", ".join(
            f"{c}@{p}" for c, p in sorted(layout.roots.items()))))
    except CgroupUnavailable as exc:
        add(Check("cgroups", False, str(exc)))
    thp = _read("/sys/kernel/mm/transparent_hugepage/enabled")
    add(Check("transparent huge pages", thp is not None and "[never]" not in thp, thp or "absent"))
    add(_ksm())
    uffd = _read("/proc/sys/vm/unprivileged_userfaultfd")
    add(Check("userfaultfd", uffd is not None or os.path.exists("/dev/userfaultfd"),
              f"unprivileged_userfaultfd={uffd}" if uffd is not None else "sysctl absent"))
    modules = os.path.exists("/proc/modules")
    add(Check("loadable kernel modules", modules, "yes" if modules else "kernel built without module support"))
    kmod = kmod_probe.probe()
    add(Check("bunshin kernel module", kmod.can_load, kmod.detail))
    add(_chromium())
    release = tuple(int(x) for x in os.uname().release.split(".")[:2] if x.isdigit())
    add(Check("pidfd setns", release >= (5, 8), f"kernel {os.uname().release} (workers enter clones by pidfd)"))
    add(Check("open_tree", release >= (5, 2), "detached pool mount for overlay layers"))
    mounted = "favordynmods" in Path("/proc/self/mountinfo").read_text()
    add(Check("fast cgroup moves", release >= (6, 0),
              f"kernel {os.uname().release}: each run mounts a favordynmods cgroup hierarchy (fast_moves.py; the "
              f"mode then stays until reboot); {'a hierarchy holds it now' if mounted else 'none mounted now'}"
              if release >= (6, 0) else "needs Linux 6.0 (favordynmods): a clone's cgroup move waits for RCU"))

    need = ["root", "namespace mount", "namespace net", "namespace uts", "namespace ipc", "namespace pid",
            "overlayfs", "btrfs", "cgroups", "pidfd setns", "open_tree"]
    missing = [n for n in need if not report.ok(n)]
    verdict = (not missing, "ready" if not missing else "missing: " + ", ".join(missing))
    report.backends["cow"] = verdict
    report.backends["restore"] = verdict
    # the tree fork: the module loaded here (/dev/bunshin), its builder, one cgroup hierarchy (v2)
    tree = [why for why in (kmod_unavailable(), None if _cgroup_v2(report) else "needs cgroup v2") if why]
    add(Check("tree fork (kmod)", verdict[0] and not tree,
              "; ".join(tree) if tree else "module loaded, builder at " + str(builder_path())))
    report.backends["kmod"] = (verdict[0] and not tree, "ready" if verdict[0] and not tree
                               else "; ".join(([verdict[1]] if not verdict[0] else []) + tree))
    # Docker: images as workspace roots (--image docker:NAME) need a daemon that answers; the Docker runtime too,
    # whose fork is not live: a fresh container from the source's committed files, its app's state restored
    from ..images.docker_daemon import answers
    from ..images.docker_roots import DEFAULT_SOCKET

    dockerd, daemon = shutil.which("dockerd"), answers(DEFAULT_SOCKET)
    add(Check("docker daemon", daemon, f"a daemon answers at {DEFAULT_SOCKET}" if daemon else
              f"no daemon answers at {DEFAULT_SOCKET}" + ("" if dockerd else "; no dockerd (apt-get install docker.io)")))
    report.backends["docker (--runtime docker)"] = (
        verdict[0] and daemon, "ready; its fork is not live: a fresh container from the source's committed files "
        "with the app's state restored, KSM merging what it can" if verdict[0] and daemon
        else "; ".join(([verdict[1]] if not verdict[0] else []) + ([] if daemon else ["no Docker daemon"])))
    # What neither backend can carry (a browser's processes: threads, a GPU process, sockets to its children) is
    # forked by replay, whichever backend runs: the clone starts its own and is brought to the source's state
    browser = verdict[0] and report.ok("chromium")
    add(Check("browser fork: replay", browser, "a clone's Chromium is started fresh and brought to its source's "
              "state (tabs, history, cookies, typed text, focus, scroll), checked equal" if browser
              else "needs a fork backend and chromium"))
    return report

#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""The tree fork's benchmark, run inside the VM (``kmod/vmtest --treefork-bench`` calls it through the host's
userland at /host; ``bunshin bench treefork`` runs that): the same workload made N times three ways, in one boot.

- ``kmod``: the tree fork of a running source (``workloads.fork``: freeze, snapshot of its /tmp, read, build and
  graft, thaw), one clone after another;
- ``criu``: Debian's CRIU 3.17, the source dumped once with ``--leave-running``, then restored N times, each into
  fresh namespaces (its own network namespace, mount namespace on a copy of the source's root directory);
- ``cold``: the workload started afresh N times.

Per instance: **ready**, from the start of the fork (the freeze) / the restore / the start until the workload
answers (Chromium: DevTools evaluates the loaded page's title; the desktop: a new X client lists the window tree
with the source's X client in it); **freeze**, how long the source was stopped for it (kmod: freeze to thaw; criu:
the dump, paid once for every restore; cold: none). Per N (1, 4, 16 by default, made one after another, measured
when the N-th is ready): **memory**, the guest's MemAvailable drop since before the first instance (what N cost the
machine: shared frames counted once) and the instances' PSS sum.

    bench.py --builder BIN --images DIR [--workloads chromium,xdesktop,calc] [--clones 1,4,16]

Owns: the three ways and their measurements. Prints progress as "# bench: ..." lines and the result as one JSON
line (a way that fails, CRIU on a workload it cannot dump say, is a result too: its error is in ``failures``; the
exit status is 1 only when the tree fork failed). Cleans up every container, restore and dump it made, on every
path.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import workloads as wl

CRIU = "/usr/sbin/criu"
# bind mounts of the workload's root that CRIU treats as external (their key in the dump, and what they are on
# restore: the image's /usr and /etc, the guest's /dev)
EXTERNAL = ("usr", "etc", "dev")


def say(msg: str) -> None:
    print(f"# bench: {msg}", flush=True)


@dataclass
class Workload:
    """What the benchmark starts, and how it knows an instance is ready."""

    name: str
    image: Path
    argv: list[str]
    files: tuple[str, ...]
    ready: Callable[[wl.Container], bool]
    start_timeout: float


def chromium_ready(box: wl.Container) -> bool:
    try:
        return bool(wl.evaluate(box, "document.readyState == 'complete' && document.title", timeout=20))
    except Exception:  # not listening yet, or the page not loaded
        return False


def xdesktop_ready(box: wl.Container) -> bool:
    return "bunshin-xev" in wl.windows(box)


def calc_ready(box: wl.Container) -> bool:
    """Calc's window with its sheet, in the window tree a new X client gets (the desktop's criterion)."""
    return wl.CALC_WINDOW in wl.windows(box)


def workload(name: str, images: str | None) -> Workload:
    from bunshin.envs.images.recipes import recipe
    from bunshin.envs.images.store import ImageStore

    store = ImageStore(Path(images) if images else None)
    if name == "chromium":
        return Workload(name, store.require(recipe("chromium")).root,
                        ["/usr/bin/chromium", *wl.CHROMIUM_FLAGS, "file:///tmp/shop.html"], (str(wl.shop_page()),),
                        chromium_ready, 300)
    if name == "xdesktop":
        return Workload(name, store.require(recipe("desktop")).root, ["/bin/sh", "-c", wl.XDESKTOP_SCRIPT], (),
                        xdesktop_ready, 120)
    if name == "calc":
        return Workload(name, store.require(recipe("desktop")).root, ["/bin/sh", "-c", wl.CALC_SCRIPT],
                        wl.calc_files(), calc_ready, 600)
    raise SystemExit(f"bench.py: no workload {name!r} (have chromium, xdesktop, calc)")


def wait_ready(spec: Workload, box: wl.Container, since: float) -> float:
    """Milliseconds from ``since`` until ``box`` answers; raises if it does not within the workload's timeout."""
    deadline = since + spec.start_timeout
    while not spec.ready(box):
        if time.monotonic() > deadline or (box.launcher is not None and box.launcher.poll() is not None):
            log = wl.WORK / box.name / "launcher.log"
            raise TimeoutError(f"{box.name} did not answer within {spec.start_timeout:.0f} s or ended"
                               + (f"; its launcher said: {log.read_text()[-1500:]}" if log.exists() else ""))
        time.sleep(0.05)
    return (time.monotonic() - since) * 1000


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def pss(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
    return total


def tree_now(init: int) -> list[int]:
    """The processes of a tree as they are now (one may end while it is walked: the desktop's shell runs a `sleep`
    a second)."""
    try:
        return wl._tree(init)
    except OSError:
        time.sleep(0.1)
        return wl._tree(init)


def settle() -> None:
    """Let the guest's memory figures settle before a reading (freed pages returned, RCU callbacks run)."""
    time.sleep(2)


class Series:
    """The instances of one way made one after another, and the rows at each N of ``counts``."""

    def __init__(self, spec: Workload, backend: str, counts: list[int], rows: list[dict]):
        """Its rows are appended to ``rows`` as they are measured (a way failing later keeps them)."""
        self.spec, self.backend, self.counts = spec, backend, counts
        self.ready_ms: list[float] = []
        self.freeze_ms: list[float] = []
        self.boxes: list[wl.Container] = []
        self.rows = rows
        self.refused = 0  # tree-fork attempts refused for a transient state, then made again
        settle()
        self.baseline = mem_available()

    def add(self, box: wl.Container, ready_ms: float, freeze_ms: float | None) -> None:
        self.boxes.append(box)
        self.ready_ms.append(ready_ms)
        if freeze_ms is not None:
            self.freeze_ms.append(freeze_ms)
        n = len(self.boxes)
        say(f"{self.spec.name} {self.backend} {n}/{max(self.counts)}: ready {ready_ms:.0f} ms"
            + (f", source frozen {freeze_ms:.0f} ms" if freeze_ms is not None else ""))
        if n in self.counts:
            settle()
            drop = self.baseline - mem_available()
            held = pss([p for b in self.boxes for p in tree_now(b.init)])
            self.rows.append({
                "workload": self.spec.name, "backend": self.backend, "n": n,
                "ready_ms_p50": statistics.median(self.ready_ms),
                "freeze_ms_p50": statistics.median(self.freeze_ms) if self.freeze_ms else None,
                "memory_bytes": drop, "pss_bytes": held, "refused_attempts": self.refused,
                "ready_ms": [round(r, 1) for r in self.ready_ms], "freeze_ms": [round(f, 1) for f in self.freeze_ms],
            })
            say(f"{self.spec.name} {self.backend} n={n}: MemAvailable -{drop / 2**20:.0f} MiB, "
                f"PSS {held / 2**20:.0f} MiB")


def run_kmod(spec: Workload, source: wl.Container, counts: list[int], builder: str, made: list[wl.Container],
             rows: list[dict]) -> None:
    series = Series(spec, "kmod", counts, rows)
    for k in range(max(counts)):
        started = time.monotonic()
        clone, frozen, refused = wl.fork_when_quiet(source, f"{spec.name}-kmod-{k}", builder, made)
        series.refused += refused
        clone.freeze(False)
        say(f"{spec.name} kmod {k + 1}: " + ", ".join(f"{step} {ms:.0f} ms" for step, ms in clone.steps_ms.items())
            + (f"; watches {[w.path for f in clone.build.plan.files for w in f.watches]}" if clone.build and k == 0
               else ""))
        series.add(clone, wait_ready(spec, clone, started), frozen)


def run_cold(spec: Workload, counts: list[int], made: list[wl.Container], rows: list[dict]) -> None:
    series = Series(spec, "cold", counts, rows)
    for k in range(max(counts)):
        started = time.monotonic()
        box = wl.start(f"{spec.name}-cold-{k}", spec.argv, spec.files, spec.image, network=True)
        made.append(box)
        series.add(box, wait_ready(spec, box, started), None)


# --- CRIU ---------------------------------------------------------------------------------------------------------


def criu_root(base: Path) -> Path:
    """A container root directory as CRIU's restore wants one (a directory, bind-mounted on itself by the caller):
    the same skeleton as ``workloads.make_root``'s, mount points for the workload's mounts."""
    root = base / "rootfs"
    root.mkdir(parents=True)
    for link in ("bin", "sbin", "lib", "lib64"):
        os.symlink(f"usr/{link}", root / link)
    for d in ("usr", "etc", "dev", "proc", "tmp", "run", "sys"):
        (root / d).mkdir()
    return root


PIVOT = """set -e
r={root}
mount --bind $r $r
for d in usr etc; do mount --bind {image}/$d $r/$d; mount -o remount,bind,ro $r/$d; done
mount --bind /dev $r/dev
mkdir -p $r/dev/shm
mount -t tmpfs tmp $r/tmp
mount -t tmpfs shm $r/dev/shm
for f in {files}; do cp "$f" $r/tmp/; done
cd $r
mkdir .old
pivot_root . .old
mount -t proc proc /proc
umount -l /.old
rmdir /.old
hostname {name}
cd /tmp
exec setsid "$@" </dev/null >/dev/null 2>&1
"""


def start_pivoted(spec: Workload, name: str) -> wl.Container:
    """The workload as CRIU can dump it: the same processes on the same image, in a container whose root is the
    root of its own mount namespace (``pivot_root``: ``workloads.start``'s chroot leaves the guest's whole mount
    tree, 9p and initramfs included, in the namespace, which CRIU cannot dump) and whose pid 1 leads its own
    session (CRIU refuses a session leader outside the tree)."""
    base = wl.WORK / name
    root = criu_root(base)
    cgroup = wl.CGROUP / f"treefork-{name}"
    cgroup.mkdir()
    inner = PIVOT.format(root=root, image=spec.image, files=" ".join(shlex.quote(f) for f in spec.files), name=name)
    script = (f"echo $$ > {cgroup}/cgroup.procs && exec unshare --pid --fork --mount --uts --ipc "
              f"--propagation private /bin/sh -c {shlex.quote(inner)} {name} "
              + " ".join(shlex.quote(a) for a in spec.argv))
    return wl.launch(wl.Container(name, root, cgroup), script)


def criu(args: list[str], log: Path, what: str) -> None:
    """Run CRIU; a failure raises with its log's errors (with BUNSHIN_BENCH_VERBOSE set, which ``kmod/vmtest``
    passes on, the 40 log lines before its last errors are printed too)."""
    done = subprocess.run([CRIU, *args, "-v4", "-o", str(log)], capture_output=True, text=True, timeout=600)
    if done.returncode:
        errors = [line for line in log.read_text(errors="replace").splitlines() if "Error" in line or "error" in line] \
            if log.exists() else []
        if os.environ.get("BUNSHIN_BENCH_VERBOSE") and log.exists():
            lines = log.read_text(errors="replace").splitlines()
            fatal = [i for i, line in enumerate(lines) if "Error" in line][-3:] or [len(lines)]
            for line in lines[max(0, fatal[0] - 40):fatal[-1] + 1]:
                say("criu " + line)
        raise RuntimeError(f"criu {what} failed ({done.returncode}): {done.stderr[-500:]}\n" + "\n".join(errors[-15:]))


COMMON = ["--manage-cgroups=ignore", "--tcp-established", "--file-locks", "--force-irmap"]


def watched_dirs(box: wl.Container) -> list[str]:
    """The directories holding what the tree's inotify watches name, inside its root (read as the tree fork reads
    them). CRIU resolves a watch through its file handle, and on a file system without handles (the guest's 9p)
    only by scanning directories it is told of: given these, as a user of it would be."""
    from bunshin.envs.runtime.treefork.inotify import inotify_watches

    out = set()
    for pid in wl._tree(box.init):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:inotify":
                    info = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
                    out.update(os.path.dirname(w.path.rstrip("/")) or "/"
                               for w in inotify_watches(pid, info, "/", f"pid {pid} fd {fd}"))
    return sorted(out)


def dump(source: wl.Container, images: Path) -> float:
    """Milliseconds of ``criu dump --leave-running`` of the source (it is stopped for as long; finding the
    directories CRIU is to scan for inotify watches is not counted)."""
    images.mkdir(parents=True)
    scan = [a for d in watched_dirs(source) for a in ("--irmap-scan-path", d)]
    started = time.monotonic()
    criu(["dump", "-t", str(source.init), "-D", str(images), "--leave-running", *COMMON, *scan,
          *[a for d in EXTERNAL for a in ("--external", f"mnt[/{d}]:{d}")]], images / "dump.log", "dump")
    return (time.monotonic() - started) * 1000


def restore(spec: Workload, snapshot: str, images: Path, name: str) -> wl.Container:
    """A restore of the dump into fresh namespaces (network with its loopback up, mount on a btrfs snapshot of the
    source's root directory as it was at the dump (the layer ``snapshot``: made as the tree fork's clones get
    theirs), pid, UTS, IPC: CRIU makes those it dumped), in a cgroup of its own; returns once ``criu restore -d``
    has returned (the tree runs)."""
    base = wl.WORK / name
    base.mkdir(parents=True)
    assert wl._pool is not None
    root = wl._pool.snapshot(snapshot, name) / "upper"  # the root's own files (the mounts on it are CRIU's)
    cgroup = wl.CGROUP / f"treefork-{name}"
    cgroup.mkdir()
    pidfile = base / "pid"
    external = {"usr": spec.image / "usr", "etc": spec.image / "etc", "dev": "/dev"}
    inner = (f"ip link set lo up && mount --make-rprivate / && mount --bind {root} {root} && exec {CRIU} restore "
             f"-D {images} -d --root {root} --pidfile {pidfile} -v4 -o {base}/restore.log "
             + " ".join(COMMON) + " "
             + " ".join(f"--external mnt[{k}]:{v}" for k, v in external.items()))
    script = f"echo $$ > {cgroup}/cgroup.procs && exec unshare --net --mount /bin/sh -c {shlex.quote(inner)}"
    done = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=600)
    box = wl.Container(name, root, cgroup)
    if done.returncode or not pidfile.exists():
        log = (base / "restore.log").read_text(errors="replace").splitlines() if (base / "restore.log").exists() \
            else []
        wl.end(box)
        raise RuntimeError(f"criu restore failed ({done.returncode}): {done.stderr[-500:]}\n"
                           + "\n".join([line for line in log if "rror" in line][-15:]))
    box.init = int(pidfile.read_text())
    return box


def run_criu(spec: Workload, counts: list[int], made: list[wl.Container], rows: list[dict]) -> None:
    source = start_pivoted(spec, f"{spec.name}-criu-source")
    made.append(source)
    say(f"{spec.name} criu: source up in {wait_ready(spec, source, time.monotonic()) / 1000:.1f} s")
    images = wl.WORK / f"{spec.name}-criu-images"
    try:
        frozen = dump(source, images)
        # the root directory's own files as they were at the dump (CRIU checks the files it finds open against
        # their dumped size: openbox's log grows), copied into a layer right after it (a few KiB, not counted)
        snapshot = f"{spec.name}-criu-root"
        assert wl._pool is not None
        shutil.copytree(source.root, wl._pool.create(snapshot) / "upper", symlinks=True, dirs_exist_ok=True)
        say(f"{spec.name} criu: dumped in {frozen:.0f} ms, {sum(f.stat().st_size for f in images.iterdir()) >> 20} "
            "MiB of images")
        series = Series(spec, "criu", counts, rows)  # after the dump: its images (in the guest's memory) are not counted
        for k in range(max(counts)):
            started = time.monotonic()
            box = restore(spec, snapshot, images, f"{spec.name}-criu-{k}")
            made.append(box)
            series.add(box, wait_ready(spec, box, started), frozen)
    finally:
        shutil.rmtree(images, ignore_errors=True)
        if wl._pool is not None:
            wl._pool.delete(f"{spec.name}-criu-root")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--builder", required=True)
    ap.add_argument("--images", help="the workspace image store (BUNSHIN_IMAGE_DIR)")
    ap.add_argument("--workloads", default="chromium,xdesktop")
    ap.add_argument("--backends", default="kmod,criu,cold")
    ap.add_argument("--clones", default="1,4,16", help="the Ns at which memory is read (the largest are made)")
    ap.add_argument("--threads-bin")  # vmtest passes the workloads' common arguments
    ap.add_argument("--generations")
    args = ap.parse_args()
    counts = sorted({int(n) for n in args.clones.split(",")})
    wl.WORK.mkdir(parents=True, exist_ok=True)
    with wl.layer_pool():
        rows, failures = measure(args, counts)
    print(json.dumps({"kernel": os.uname().release, "cpus": os.cpu_count(), "clones": counts, "rows": rows,
                      "failures": failures}), flush=True)
    return 1 if any(f["backend"] == "kmod" for f in failures) else 0


def measure(args: argparse.Namespace, counts: list[int]) -> tuple[list[dict], list[dict]]:
    """Every workload every way: the rows measured and the ways that failed."""
    rows: list[dict] = []
    failures: list[dict] = []
    for name in args.workloads.split(","):
        spec = workload(name, args.images)
        for backend in args.backends.split(","):
            started = time.monotonic()
            try:
                with wl.containers() as made:
                    if backend == "kmod":
                        source = wl.start(f"{name}-kmod-source", spec.argv, spec.files, spec.image)
                        made.append(source)
                        say(f"{name} kmod: source up in {wait_ready(spec, source, time.monotonic()) / 1000:.1f} s")
                        run_kmod(spec, source, counts, args.builder, made, rows)
                    elif backend == "criu":
                        run_criu(spec, counts, made, rows)
                    else:
                        run_cold(spec, counts, made, rows)
            except Exception as e:  # the other ways still run; the failure is in the JSON
                failures.append({"workload": name, "backend": backend, "error": f"{type(e).__name__}: {e}"})
                say(f"FAIL {name} {backend}: {failures[-1]['error']}")
            say(f"{name} {backend}: {time.monotonic() - started:.0f} s")
    return rows, failures


if __name__ == "__main__":
    sys.exit(main())

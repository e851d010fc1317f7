"""A Ray cluster of simulated nodes on this machine: several raylets, each its own node (``ray.cluster_utils``).

Owns: ``local_cluster(n)`` (a context manager: a head and ``n - 1`` more raylets, small object stores,
node death noticed within seconds; everything removed on exit, and checked gone), ``parse_local``
(``local:N`` as ``--ray`` takes it), ``remove_session`` (Ray's session directory, once its cluster is gone) and
``ray_processes`` (the Ray processes this process started, for the checks).
For ``bunshin eval --ray local:N``, the tests and ``bunshin bench scale``: the nodes share the machine's cores and
memory, so only ratios mean anything.
Must never: leave a raylet, GCS, worker or (unless asked) its session directory behind when the context exits.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import EngineError

OBJECT_STORE_BYTES = 100 << 20
# A killed raylet is declared dead after about period x threshold: seconds, not Ray's default half a minute.
SYSTEM_CONFIG = {"health_check_initial_delay_ms": 1000, "health_check_period_ms": 500,
                 "health_check_failure_threshold": 4, "health_check_timeout_ms": 1000}
RAY_PROGRAMS = (b"raylet", b"gcs_server", b"default_worker.py", b"ray::", b"log_monitor.py", b"monitor.py",
                b"dashboard", b"runtime_env", b"ray_client_server")


class LocalClusterError(EngineError, RuntimeError):
    """A local cluster could not be made or was not removed whole."""


def parse_local(address: str) -> int | None:
    """``local:N`` -> N (>= 1); None for any other address (a real cluster's, given to ``ray.init``)."""
    if not address.startswith("local:"):
        return None
    try:
        n = int(address.removeprefix("local:"))
    except ValueError:
        raise LocalClusterError(f"--ray {address!r}: expected local:N with N a number of nodes") from None
    if n < 1:
        raise LocalClusterError(f"--ray {address!r}: a cluster needs at least one node")
    return n


def ray_processes(session_dir: str) -> list[int]:
    """Ray's processes (raylets, GCS, workers, monitors) of the cluster whose session is ``session_dir``: its path
    is on their command line, or their output goes to its logs (a worker renames itself ``ray::Actor``)."""
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z" or not any(p in cmd for p in RAY_PROGRAMS):
            continue
        if session_dir.encode() in cmd or any(_writes_under(entry / "fd" / fd, session_dir) for fd in ("1", "2")):
            found.append(int(entry.name))
    return found


def remove_session(session_dir: str) -> None:
    """Ray's session directory of a cluster that is gone (its logs and sockets) and the ``session_latest`` link to
    it."""
    path = Path(session_dir)
    latest = path.parent / "session_latest"
    with contextlib.suppress(OSError):
        if latest.is_symlink() and Path(os.readlink(latest)) == path:
            latest.unlink()
    shutil.rmtree(path, ignore_errors=True)


def _writes_under(fd: Path, directory: str) -> bool:
    try:
        return os.readlink(fd).startswith(directory + "/")
    except OSError:
        return False


@contextlib.contextmanager
def local_cluster(nodes: int, *, cpus_per_node: int = 1, settle_s: float = 30.0,
                  resources: list[dict[str, float]] | None = None, keep_logs: bool = False) -> Iterator[Any]:
    """A head and ``nodes - 1`` more raylets (``resources[i]``: node i's custom resources); yields the
    ``ray.cluster_utils.Cluster`` (its ``address`` is what ``ray.init`` takes). On exit every node is removed,
    every Ray process of the cluster checked gone within ``settle_s``, and Ray's session directory (logs, sockets)
    removed unless ``keep_logs``."""
    from ray.cluster_utils import Cluster

    if nodes < 1:
        raise LocalClusterError("a cluster needs at least one node")
    extra = resources or [{} for _ in range(nodes)]
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": cpus_per_node, "object_store_memory": OBJECT_STORE_BYTES, "include_dashboard": False,
        "resources": extra[0], "_system_config": SYSTEM_CONFIG})
    # ray's Cluster sets head_node = None in __init__ before it starts the head (initialize_head), so its inferred
    # type is None
    session_dir = cluster.head_node.get_session_dir_path()  # type: ignore[attr-defined]
    try:
        for i in range(1, nodes):
            cluster.add_node(num_cpus=cpus_per_node, object_store_memory=OBJECT_STORE_BYTES,
                             resources=extra[i] if i < len(extra) else {})
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()
        deadline = time.monotonic() + settle_s
        while (left := ray_processes(session_dir)) and time.monotonic() < deadline:
            time.sleep(0.2)
        if left:
            raise LocalClusterError(f"Ray processes of {session_dir} left after shutdown: {left}")
        if not keep_logs:
            remove_session(session_dir)

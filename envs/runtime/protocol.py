"""The runtime's wire protocols: engine <-> workspace host, engine <-> nursery, and host <-> worker, framed as
MessagePack over Unix sockets (``channel.py``).

Owns: these msgspec Structs (tagged unions, handled with ``match``) and their encoder and decoders, built once.
Must never: do I/O, or be imported by code outside ``bunshin.envs.runtime`` (the public records are
``bunshin.envs.records``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..records import AppSpec, Observation, ToolCall

# -- engine -> host ------------------------------------------------------------------------------

# a tree-fork host's descriptors from the engine (``HostConfig.tree``): its clones get theirs at the same numbers
TREE_CHANNEL_FD = 3
TREE_POOL_FD = 4  # closed once the root is built
TREE_CGROUP_FD = 5  # the first of the cgroup hierarchies'


class HostConfig(msgspec.Struct, frozen=True, kw_only=True, tag="config"):
    """First frame to a freshly spawned host: everything it needs to build its workspace."""

    ws_id: str
    hostname: str
    seed: int
    layer: str  # name of its writable layer in the pool
    lower: str  # image directory, relative to the pool
    image_binds: list[tuple[str, str]]  # (host path, path inside) bound read-only: the image's /usr
    runtime_binds: list[str]  # the host interpreter's paths: hidden below RUNTIME_DIR, reached by symlinks
    mount_target: str  # empty directory (host path) where the root is assembled before pivot_root
    cgroup_rel: str  # the workspace's cgroup below each hierarchy fd
    app: AppSpec
    reaper_pid: int  # the run's nursery: clones are orphaned onto it, and die when it dies
    # a live clone is forked in one step as its source's sibling where it can be (``fork/sibling.py``); False: the
    # double fork always (the comparison ``bench fork --two-step`` makes)
    one_step_clones: bool = True
    restore_from: str | None = None  # checkpoint file relative to the pool (private-restore backend)
    restore_workers: int = 0  # worker images beside it, ``<restore_from>.w<index>``
    faults: list[str] = []
    # every program of the workspace may be merged by KSM (``PR_SET_MEMORY_MERGE`` on the host before anything
    # starts, inherited): a workspace that opts in under a backend whose clones share nothing (``ksm.py``)
    merge_memory: bool = False
    # a tree-fork host (``fork/kmod.py``): pid 1 of a PID namespace of its own, its agents in it too, its external
    # descriptors at fixed numbers (``TREE_CHANNEL_FD``...), nothing of the pool kept open once built
    tree: bool = False
    # the pool's mount point, as the engine sees it: a tree-fork host names its layers through it (a kernel as old
    # as Debian 12's 6.1 takes no overlay upper layer on a detached mount, which the pool descriptor is)
    pool_path: str = ""
    # a host in a Docker container (``docker_hosts.py``): pid 1 of the container, which is its isolation (no
    # namespaces, mounts or cgroups of its own to make); its agents are found by their uid, not a cgroup
    container: bool = False
    # a Docker image's ``Env`` and ``WorkingDir`` for agent commands (``agents.py``; empty: the workspace's own)
    image_env: dict[str, str] = {}
    image_cwd: str = ""


class Execute(msgspec.Struct, frozen=True, kw_only=True, tag="execute"):
    call: ToolCall
    timeout_s: float = 60.0


class Borrow(msgspec.Struct, frozen=True, kw_only=True):
    """A warm-pool slot a running clone takes over (``warm_pool.py``): the slot host's pid (the clone enters its
    network namespace and copies ``fds`` out of it through a pidfd), what its app lent (``Lent``)."""

    pid: int
    fds: dict[str, int]  # name -> descriptor number in the slot host
    data: dict[str, Any] = {}


class CloneSpec(msgspec.Struct, frozen=True, kw_only=True):
    ws_id: str
    hostname: str
    seed: int
    layer: str
    cgroup_rel: str  # the clone's own new cgroup, or the slot's it borrows
    frozen: bool = False  # a snapshot: read-only root, does not run tools, can be forked again
    borrow: Borrow | None = None
    shell: bool = False  # a prepared shell (``shells.py``): the fork's second descriptor is a pidfd of its holder


class Fork(msgspec.Struct, frozen=True, kw_only=True, tag="fork"):
    """Fork the workspace live. Carries the clone's end of its new socket, then with ``clone.shell`` a pidfd of the
    prepared shell's holder, whose namespaces the clone enters."""

    clone: CloneSpec


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True, tag="checkpoint"):
    path: str  # relative to the pool
    layer: str  # read-only snapshot of the files, taken at the same instant


class Ping(msgspec.Struct, frozen=True, tag="ping"):
    pass


class Lend(msgspec.Struct, frozen=True, tag="lend"):
    """To a warm-pool slot: hand over what its app started ahead (``WorkspaceApp.lend``); answered ``Lent``."""


class Close(msgspec.Struct, frozen=True, tag="close"):
    pass


class Become(msgspec.Struct, frozen=True, kw_only=True, tag="become"):
    """To a tree-fork clone, the first request on its own channel: the workspace it now is (its source's state
    is its own from here); answered ``Ready``."""

    ws_id: str
    seed: int
    layer: str
    cgroup_rel: str


Request = Execute | Fork | Checkpoint | Ping | Lend | Close | Become


# -- host protocol: host -> engine ------------------------------------------------------------------------------


class Ready(msgspec.Struct, frozen=True, kw_only=True, tag="ready"):
    ws_id: str
    pid: int
    setup_s: float
    steps_s: dict[str, float] = {}  # a clone's setup by step, in order (``fork/clone.py``): where its time went


class Executed(msgspec.Struct, frozen=True, kw_only=True, tag="executed"):
    observation: Observation


class Forked(msgspec.Struct, frozen=True, kw_only=True, tag="forked"):
    freeze_ns: int  # how long the source stopped serving, measured inside the source
    one_step: bool = False  # the clone was forked in one step (``fork/sibling.py``), not through a middle process
    cpu_ns: int = 0  # the source's CPU for this fork, its middle process's included (two steps)
    clone_pid: int = 0  # the clone's pid (the engine kills it by it if it never becomes ready); 0: not known


class Checkpointed(msgspec.Struct, frozen=True, kw_only=True, tag="checkpointed"):
    bytes_written: int  # every image: the host's and its workers'
    freeze_ns: int
    workers: int = 0  # worker images written beside the host's, ``<path>.w<index>``


class Pong(msgspec.Struct, frozen=True, kw_only=True, tag="pong"):
    pid: int
    state_version: int


class Lent(msgspec.Struct, frozen=True, kw_only=True, tag="lent"):
    """What a slot's app lent: descriptors by name (numbers in the slot host, which keeps them open and never
    touches them again) and data; the engine passes them on as a ``Borrow``."""

    pid: int
    fds: dict[str, int]
    data: dict[str, Any] = {}


class Closed(msgspec.Struct, frozen=True, tag="closed"):
    pass


class Failed(msgspec.Struct, frozen=True, kw_only=True, tag="failed"):
    """The request was refused or failed; the host keeps serving. ``kind`` names the class of failure."""

    kind: str  # "bad_request" | "fork" | "checkpoint" | "tool" | "internal"
    message: str


# -- nursery protocol: engine <-> the run's reaper process ---------------------------------------------------------


class NurserySpawn(msgspec.Struct, frozen=True, kw_only=True, tag="spawn"):
    """Start a process; the frame's descriptors are passed to it, named ``{0}``, ``{1}``... in ``argv``."""

    argv: list[str]
    log_path: str
    cwd: str
    cgroup_rel: str | None = None  # join this group below each of the descriptors ``cgroup_fds`` before running
    cgroup_fds: list[int] = []  # indexes into the frame's descriptors: cgroup hierarchy directories
    pid_namespace: bool = False  # pid 1 of a new PID namespace (a tree-fork host)
    stdin: int = -1  # indexes into the frame's descriptors for its standard input and output (-1: /dev/null, the log)
    stdout: int = -1
    env: dict[str, str] = {}  # added to the nursery's environment
    root: RootSpec | None = None  # made in a mount namespace of its own before it runs (a tree-fork builder)


class RootSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A workspace root assembled at ``target`` (``rootfs.assemble``), in the spawned process's own mount
    namespace; the overlay's paths are relative to the pool, mounted at ``pool_path`` in the engine's mount
    namespace."""

    pool_path: str
    target: str
    lower: str
    layer: str
    image_binds: list[tuple[str, str]]
    runtime_binds: list[str]


class NurseryShell(msgspec.Struct, frozen=True, kw_only=True, tag="shell"):
    """Make a prepared shell's holder (``shells.py``): a child of the nursery in group ``cgroup_rel`` below each of
    the frame's descriptors (cgroup hierarchy directories) with fresh network, UTS and IPC namespaces, named
    ``hostname``, loopback up, that waits to be killed. The reply is ``NurserySpawned`` once it is all made."""

    cgroup_rel: str
    hostname: str
    ready_timeout_s: float = 10.0
    faults: list[str] = []  # fault points of the holder (``faults.py``): ``shell.holder``


class NurserySpawned(msgspec.Struct, frozen=True, kw_only=True, tag="spawned"):
    pid: int
    fds: list[int] = []  # the numbers the frame's descriptors have in the spawned process


class NurseryFailed(msgspec.Struct, frozen=True, kw_only=True, tag="spawn_failed"):
    message: str


class NurseryExited(msgspec.Struct, frozen=True, kw_only=True, tag="exited"):
    """Unsolicited: a process of the run exited (waitpid status; the CPU it used, its reaped children's included,
    from ``wait4``'s resource usage)."""

    pid: int
    status: int
    cpu_ns: int = 0


Reply = Ready | Executed | Forked | Checkpointed | Pong | Lent | Closed | Failed



# -- host <-> its workers ------------------------------------------------------------------------------------------


class WorkerCall(msgspec.Struct, frozen=True, tag="call"):
    method: str
    args: dict[str, Any] = {}


class WorkerBeforeFork(msgspec.Struct, frozen=True, tag="before_fork"):
    pass


class WorkerFork(msgspec.Struct, frozen=True, tag="fork"):
    """Carries one descriptor: the socket end the worker's clone will answer on."""


class WorkerAdopt(msgspec.Struct, frozen=True, kw_only=True, tag="adopt"):
    """To a worker's clone, from the clone's host; carries a pidfd of that host."""

    ws_id: str
    seed: int
    cgroup_rel: str
    reaper_pid: int
    frozen: bool = False


class WorkerCheckpoint(msgspec.Struct, frozen=True, tag="checkpoint"):
    """For the private-restore backend: quiesce (``before_fork``) and write ``WorkerApp.checkpoint()`` as a
    checkpoint file into the descriptor sent with the message (the worker's own image); answers the bytes written."""


class WorkerReply(msgspec.Struct, frozen=True, kw_only=True, tag="reply"):
    value: Any = None
    error: str | None = None


WorkerMessage = WorkerCall | WorkerBeforeFork | WorkerFork | WorkerAdopt | WorkerCheckpoint


encoder = msgspec.msgpack.Encoder()
request_decoder = msgspec.msgpack.Decoder(Request)
config_decoder = msgspec.msgpack.Decoder(HostConfig)
reply_decoder = msgspec.msgpack.Decoder(Reply)
nursery_decoder = msgspec.msgpack.Decoder(NurserySpawn | NurseryShell | NurserySpawned | NurseryFailed | NurseryExited)
worker_message_decoder = msgspec.msgpack.Decoder(WorkerMessage)
worker_reply_decoder = msgspec.msgpack.Decoder(WorkerReply)

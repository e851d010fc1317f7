"""Records that cross the engine/workspace boundary: tool calls, observations, memory figures and the host
protocol (requests and replies framed as MessagePack over the workspace's Unix socket).

Owns: every msgspec Struct the engine and a workspace host exchange, and the shared encoder/decoders.
Must never: import engine code or do I/O.
"""

from __future__ import annotations

from typing import Any

import msgspec


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """A tool invocation: ``name`` plus arguments. ``canonical()`` is the byte string equal calls share."""

    name: str
    args: dict[str, Any] = {}

    def canonical(self) -> bytes:
        return _canonical_encoder.encode(self)


class Observation(msgspec.Struct, frozen=True, kw_only=True):
    """What a tool call returned. ``error`` is set when the call itself was refused or failed."""

    output: str = ""
    exit_code: int | None = None
    error: str | None = None
    data: dict[str, Any] = {}
    tool_seconds: float = 0.0


class MemoryStats(msgspec.Struct, frozen=True, kw_only=True):
    """Memory of one workspace (or the sum over many): bytes, from smaps_rollup and the cgroup."""

    pss: int = 0
    private: int = 0
    shared: int = 0
    rss: int = 0
    anon_huge: int = 0
    cgroup_charge: int = 0
    processes: int = 0

    def __add__(self, other: MemoryStats) -> MemoryStats:
        return MemoryStats(**{f: getattr(self, f) + getattr(other, f) for f in self.__struct_fields__})


class AppSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Which application a workspace host runs: ``module:qualname`` of a WorkspaceApp subclass and its kwargs."""

    target: str = "bunshin.envs.app:WorkspaceApp"
    kwargs: dict[str, Any] = {}


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    memory_bytes: int | None = 4 << 30
    pids: int | None = 512
    command_timeout_s: float = 60.0


# -- host protocol: engine -> host ------------------------------------------------------------------------------


class HostConfig(msgspec.Struct, frozen=True, kw_only=True, tag="config"):
    """First frame to a freshly spawned host: everything it needs to build its workspace."""

    ws_id: str
    hostname: str
    seed: int
    layer: str  # name of its writable layer in the pool
    lower: str  # image directory, relative to the pool
    image_binds: list[str]  # host paths bind-mounted read-only at the same path (the default image's /usr)
    runtime_binds: list[str]  # the host interpreter's paths: hidden below RUNTIME_DIR, reached by symlinks
    mount_target: str  # empty directory (host path) where the root is assembled before pivot_root
    cgroup_rel: str  # the workspace's cgroup below each hierarchy fd
    app: AppSpec
    reaper_pid: int  # the run's nursery: clones are orphaned onto it, and die when it dies
    restore_from: str | None = None  # checkpoint file relative to the pool (private-restore backend)
    faults: list[str] = []


class Execute(msgspec.Struct, frozen=True, kw_only=True, tag="execute"):
    call: ToolCall
    timeout_s: float = 60.0


class CloneSpec(msgspec.Struct, frozen=True, kw_only=True):
    ws_id: str
    hostname: str
    seed: int
    layer: str
    cgroup_rel: str
    frozen: bool = False  # a snapshot: read-only root, does not run tools, can be forked again


class Fork(msgspec.Struct, frozen=True, kw_only=True, tag="fork"):
    """Fork the workspace live. Carries one file descriptor: the clone's end of its new socket."""

    clone: CloneSpec


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True, tag="checkpoint"):
    path: str  # relative to the pool
    layer: str  # read-only snapshot of the files, taken at the same instant


class Ping(msgspec.Struct, frozen=True, tag="ping"):
    pass


class Close(msgspec.Struct, frozen=True, tag="close"):
    pass


Request = Execute | Fork | Checkpoint | Ping | Close


# -- host protocol: host -> engine ------------------------------------------------------------------------------


class Ready(msgspec.Struct, frozen=True, kw_only=True, tag="ready"):
    ws_id: str
    pid: int
    setup_s: float


class Executed(msgspec.Struct, frozen=True, kw_only=True, tag="executed"):
    observation: Observation


class Forked(msgspec.Struct, frozen=True, kw_only=True, tag="forked"):
    freeze_ns: int  # how long the source stopped serving, measured inside the source


class Checkpointed(msgspec.Struct, frozen=True, kw_only=True, tag="checkpointed"):
    bytes_written: int
    freeze_ns: int


class Pong(msgspec.Struct, frozen=True, kw_only=True, tag="pong"):
    pid: int
    state_version: int


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


class NurserySpawned(msgspec.Struct, frozen=True, kw_only=True, tag="spawned"):
    pid: int


class NurseryFailed(msgspec.Struct, frozen=True, kw_only=True, tag="spawn_failed"):
    message: str


class NurseryExited(msgspec.Struct, frozen=True, kw_only=True, tag="exited"):
    """Unsolicited: a process of the run exited (waitpid status)."""

    pid: int
    status: int


Reply = Ready | Executed | Forked | Checkpointed | Pong | Closed | Failed

_canonical_encoder = msgspec.msgpack.Encoder(order="sorted")
encoder = msgspec.msgpack.Encoder()
request_decoder = msgspec.msgpack.Decoder(Request)
config_decoder = msgspec.msgpack.Decoder(HostConfig)
reply_decoder = msgspec.msgpack.Decoder(Reply)
nursery_decoder = msgspec.msgpack.Decoder(NurserySpawn | NurserySpawned | NurseryFailed | NurseryExited)

"""The live fork, engine side: ask the source's host to fork itself, and take the clone in.

The whole sequence, in order (each step's file):

1. here: name the clone, make its cgroup and a socketpair; send ``Fork`` to the source's host with the clone's end;
2. ``source.py`` (in the source host): freeze the agents, quiesce the app and its workers, snapshot the writable
   layer (btrfs, constant time), have every worker fork itself (``worker.py``), ``gc.freeze()``, ``fork()``
   twice (so the clone is orphaned onto the run's nursery), thaw, answer ``Forked`` with the freeze window;
3. ``clone.py`` (in the clone): join its cgroup, enter fresh namespaces, mount its own root on the snapshot,
   adopt the workers' clones, reseed, re-open files and re-create sockets, answer ``Ready`` on its own socket;
4. here: wait for that ``Ready``, register the clone. Any failure undoes what was made; the source runs on.

Owns: steps 1 and 4 and their undo.
Must never: leave a half-made clone (cgroup, layer, process) behind when a fork fails or is cancelled.
"""

from __future__ import annotations

import asyncio
import socket
import time

from ...errors import ForkFailed, RequestRefused, WorkspaceStartFailed
from ...workspace import ForkTiming
from .. import await_points
from ..host_workspace import HostSnapshot, HostWorkspace
from ..hosts import Hosts
from ..protocol import CloneSpec, Fork, Forked
from .backends import AllOrNothingFork, clone_seed


class CowFork(AllOrNothingFork):
    name = "cow"

    def __init__(self, hosts: Hosts) -> None:
        self.hosts = hosts

    async def _fork(self, source: HostWorkspace, *, seed: int | None, frozen: bool) -> HostWorkspace:
        hosts = self.hosts
        started = time.monotonic()  # the same boundary as the restore backend's: the clone's cgroup is inside
        clone_id = hosts.new_id()
        spec = CloneSpec(ws_id=clone_id, hostname=f"ws-{clone_id}", seed=clone_seed(source, seed),
                         layer=f"ws-{clone_id}", cgroup_rel=f"ws-{clone_id}", frozen=frozen)
        group = await asyncio.to_thread(hosts.new_cgroup, clone_id)
        engine_end, clone_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        engine_end.setblocking(False)
        try:
            try:
                await await_points.reached("fork.cow.request")
                reply = await source.request(Fork(clone=spec), fds=[clone_end.fileno()])
            finally:
                clone_end.close()
            forked = source.expect(reply, Forked)
            pid = await hosts.await_ready(clone_id, engine_end)
            cls = HostSnapshot if frozen else HostWorkspace
            clone = cls(hosts, clone_id, pid=pid, sock=engine_end, cgroup=group, layer=spec.layer, seed=spec.seed,
                        app=source.app_spec, parent=source.id, generation=source.generation + 1)
            clone.last_fork = ForkTiming(freeze_s=forked.freeze_ns / 1e9,
                                         ready_s=time.monotonic() - started)
        except BaseException as exc:
            engine_end.close()
            await asyncio.shield(asyncio.to_thread(hosts.remove_remains, group, spec.layer, clone_id))
            if isinstance(exc, RequestRefused | WorkspaceStartFailed):
                raise ForkFailed(source.id, f"fork to {clone_id} failed: {exc.detail}") from exc
            raise
        hosts.register(clone)
        return clone

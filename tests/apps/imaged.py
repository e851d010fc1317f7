"""An application whose every process images itself for the private-restore backend: the host keeps a counter,
its worker a token and a huge-page heap drawn from its seed at setup. A restore that recomputed the worker's state
(ran ``setup`` again, with the clone's seed) would draw another token and other bytes; one that reads the image
back gets the source's.
"""

from __future__ import annotations

import hashlib
from typing import Any

from bunshin.envs import state_image
from bunshin.envs.app import AppContext, HugeHeap, Tool, WorkerApp, WorkspaceApp, dont_fork_into_workers
from bunshin.envs.records import Observation

HEAP = 4 << 20


class ImagedWorker(WorkerApp):
    def setup(self, ctx: AppContext) -> None:
        self.token = ctx.rng.getrandbits(64)
        self.heap = HugeHeap(HEAP)
        self.heap.map[:] = ctx.rng.randbytes(HEAP)
        self.set_up_here = True

    def checkpoint(self) -> list[bytes | memoryview]:
        return state_image.dump({"token": self.token, "heap": self.heap})

    def restore(self, ctx: AppContext, data: memoryview) -> None:
        state = state_image.load(data)
        self.token, self.heap, self.set_up_here = state["token"], state["heap"], False

    def rpc_state(self) -> dict[str, Any]:
        return {"token": self.token, "digest": hashlib.blake2b(self.heap.map[:HEAP]).hexdigest(),
                "set_up_here": self.set_up_here}


class ImagedApp(WorkspaceApp):
    def setup(self, ctx: AppContext) -> None:
        self.count = 0
        self.worker = ctx.spawn("tests.apps.imaged:ImagedWorker")

    def checkpoint(self) -> list[bytes | memoryview]:
        return state_image.dump({"count": self.count})

    def restore(self, ctx: AppContext, data: memoryview) -> None:
        dont_fork_into_workers(data)
        self.worker = ctx.spawn("tests.apps.imaged:ImagedWorker")
        self.count = state_image.load(data)["count"]

    def tools(self) -> dict[str, Tool]:
        return {"bump": self._bump, "state": lambda a: Observation(output="", data={
            "count": self.count, **self.worker.call("state")})}

    def _bump(self, args: dict[str, Any]) -> Observation:
        self.count += 1
        return Observation(output=str(self.count))

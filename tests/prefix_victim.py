"""An engine with a prefix cache directory for tests to kill. Usage:
``python -m tests.prefix_victim STATE_DIR CACHE_DIR MODE`` with MODE ``kill`` (epoch 0 to the end, then epoch 1,
printing a line per result: the test kills it mid-epoch) or ``crash:N`` (the process kills itself with SIGKILL
when the checkpoint store has written its Nth chunk file, before the rename: a crash in the middle of a write)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from bunshin.engine.prefix import store as store_module
from bunshin.engine.prefix.settings import PrefixSettings
from bunshin.engine.rollout import RolloutEngine

from .test_prefix_engine import GROUP, TASKS, grounded, shop


def crash_at(n: int) -> None:
    """Every checkpoint store made from now on kills the process at its ``n``th written chunk."""
    written = 0
    original = store_module.CheckpointStore.__init__

    def fault(step: str) -> None:
        nonlocal written
        if step == "chunk.written":
            written += 1
            if written == n:
                print("crashing", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

    def init(self: store_module.CheckpointStore, root: Path, **kwargs: object) -> None:
        original(self, root, fault=fault, **kwargs)  # type: ignore[arg-type]

    store_module.CheckpointStore.__init__ = init  # type: ignore[method-assign]


async def main(state_dir: Path, cache_dir: Path, mode: str) -> None:
    if mode.startswith("crash:"):
        crash_at(int(mode.split(":")[1]))
    engine = RolloutEngine(shop(), grounded(), concurrency=8, state_dir=state_dir,
                           prefix=PrefixSettings(cache_dir=cache_dir))
    async with engine:
        print(f"run {engine.runtime.run_id} {engine.runtime.run_dir}", flush=True)
        for epoch in range(2):
            async for result in engine.stream(engine.requests(limit=TASKS, group_size=GROUP, seed=epoch)):
                print(f"result {epoch} {result.trajectory.group_id} {result.trajectory.sample}", flush=True)
            print(f"epoch {epoch} done", flush=True)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]))

"""``bunshin demo``: the main job on the embedded default, for now a live-fork demonstration.

Owns: a short, self-checking walk through the primitive: build a workspace with live heap state, fork it a few
times, let each clone diverge (a file and a heap page each), show that nobody sees anybody else's changes, and
print what it measured (freeze window, fork-to-ready, memory by PSS).
"""

from __future__ import annotations

import time

from bunshin.envs import AppSpec, ToolCall, WorkspaceRuntime

from ..errors import EngineError
from ..report import human_bytes, markdown_table


async def demo(size: int, clones: int, backend: str) -> int:
    app = AppSpec(target="bunshin.envs.runtime.heap_app:HeapApp", kwargs={"size_bytes": size})
    async with WorkspaceRuntime(backend=backend) as rt:
        print(f"run {rt.run_id}: backend {backend}, workspace heap {human_bytes(size)}")
        started = time.monotonic()
        source = await rt.create(app)
        print(f"source {source.id} ready in {time.monotonic() - started:.2f}s")
        await source.execute(ToolCall(name="shell", args={"cmd": "echo source > ~/who"}))
        rows = []
        forks = []
        for i in range(clones):
            clone = await source.fork()
            if clone.last_fork is None:
                raise EngineError(f"the {rt.backend_name} backend returned {clone.id} without its fork timing")
            forks.append(clone)
            rows.append({"workspace": clone.id, "freeze_ms": clone.last_fork.freeze_s * 1e3,
                         "ready_ms": clone.last_fork.ready_s * 1e3})
            print(f"  fork {i + 1}/{clones} -> {clone.id}: source frozen {rows[-1]['freeze_ms']:.1f} ms, "
                  f"ready in {rows[-1]['ready_ms']:.1f} ms")
        for i, clone in enumerate(forks):
            await clone.execute(ToolCall(name="shell", args={"cmd": f"echo clone-{i} > ~/who"}))
            await clone.execute(ToolCall(name="write_pages", args={"page": i, "value": 100 + i}))
        ok = True
        seen = (await source.execute(ToolCall(name="shell", args={"cmd": "cat ~/who"}))).output.strip()
        ok &= seen == "source"
        for i, (clone, row) in enumerate(zip(forks, rows, strict=True)):
            who = (await clone.execute(ToolCall(name="shell", args={"cmd": "cat ~/who"}))).output.strip()
            page = (await clone.execute(ToolCall(name="read_page", args={"page": i}))).data["byte"]
            ok &= who == f"clone-{i}" and page == 100 + i
            mem = clone.memory()
            row.update(pss=human_bytes(mem.pss), private=human_bytes(mem.private), sees=who)
        src_mem = source.memory()
        total = rt.memory()
        print()
        print(markdown_table(rows, [("workspace", "clone"), ("freeze_ms", "freeze ms"), ("ready_ms", "ready ms"),
                                    ("pss", "PSS"), ("private", "private"), ("sees", "its ~/who")]))
        print()
        print(f"source PSS {human_bytes(src_mem.pss)}; all {clones + 1} workspaces together: "
              f"PSS {human_bytes(total.pss)}, cgroup charge {human_bytes(total.cgroup_charge)} "
              f"(private copies would need ~{human_bytes((clones + 1) * src_mem.rss)})")
        print("isolation check:", "passed" if ok else "FAILED")
        return 0 if ok else 1

"""A warm-pool slot's application: a Chromium started ahead, lent to the running clone that takes the slot over.

Owns: starting the browser the way every Chromium workspace does (``browser.py``'s flags, tmpfs and KSM opt-in; its
first tab attached: the slow part of a start), and lending it once (``lend``: the pipe's descriptors, its
connection state, its tabs). The slot's host then serves nothing more; it and the browser go with the clone's
cgroup when the clone closes (``runtime/warm_pool.py``). Its browser's files are the slot's view: the image, an
empty layer, a private /tmp; pages come only over http(s) from the workspace's loopback, which is the clone's.
Must never: lend the same browser twice, or touch it once lent.
"""

from __future__ import annotations

from ..app import AppContext, Lending, ToolError, WorkspaceApp
from .browser import Chromium

TARGET = "bunshin.envs.chromium.slot:ChromiumSlotApp"


class ChromiumSlotApp(WorkspaceApp):
    def __init__(self, *, merge_memory: bool = False):
        self.merge_memory = merge_memory
        self.chromium: Chromium | None = None
        self.lent = False

    def setup(self, ctx: AppContext) -> None:
        self.chromium = Chromium(ctx, merge_memory=self.merge_memory)
        self.chromium.start()

    def lend(self, ctx: AppContext) -> Lending:
        if self.lent or self.chromium is None:
            raise ToolError("this slot's Chromium was lent already" if self.lent else "this slot has no Chromium")
        fds, data = self.chromium.lend()
        self.lent = True
        return Lending(fds=fds, data=data)

    def close(self) -> None:
        if self.chromium is not None and not self.lent:
            self.chromium.close()

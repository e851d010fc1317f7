"""What an agent (uid 65000) can try against the desktop's file tools, which read and write as root, and the grader's
``_read_file``: a symlink to the task's private expected file (``/var/lib/desktop``, mode 0700), a FIFO, a hard
link to a root-only file, ``..`` out of the home, and a directory swapped for a symlink between the check and the
open. Each probe is tried through every tool that opens a path (editor, spreadsheet, save-as, the grader) in a
real workspace, and the private file is checked unchanged; the check-then-open race is also driven
deterministically against ``files.py`` itself."""

from __future__ import annotations

import asyncio
import os
import stat
import threading
from pathlib import Path

import pytest

from bunshin.envs import ToolCall
from bunshin.envs.app import ToolError
from bunshin.envs.desktop import files
from bunshin.envs.desktop.suite import DesktopSuite
from bunshin.envs.runtime.image import AGENT_UID

PRIVATE = "/var/lib/desktop/expected/f.txt"
SECRET = b"the expected answer 4242\n"
SMALL = {"cache_mb": 8, "index_roots": ["/usr/lib/python3.11/json"], "recording_frames": 0, "screenshots": False,
         "time_scale": 0.0}


def C(name: str, **args: object) -> ToolCall:
    return ToolCall(name=name, args=args)


async def desktop(runtime):
    """A desktop with a private expected file, as a task's setup writes them (root, 0600, in a 0700 directory)."""
    ws = await runtime.create(DesktopSuite(**SMALL).app())
    put = await ws.execute(C("_put_file", path=PRIVATE, content=SECRET.decode()))
    assert put.error is None
    return ws


async def ok(ws, call: ToolCall) -> str:
    obs = await ws.execute(call)
    assert obs.error is None, (call, obs.error, obs.output[-500:])
    return obs.output


async def refused(ws, call: ToolCall, message: str) -> None:
    obs = await ws.execute(call)
    assert obs.error and message in obs.error, (call, obs.error)
    assert b"4242" not in (obs.output + repr(obs.data)).encode(), call


async def private_unchanged(ws) -> None:
    graded = await ws.execute(C("_read_file", path=PRIVATE))
    assert graded.data["content"] == SECRET  # the grader itself still reads it (root-only, under /var/lib/desktop)


async def graded_as_missing(ws, path: str) -> None:
    graded = await ws.execute(C("_read_file", path=path))
    assert graded.error and graded.data["content"] is None, graded


@pytest.mark.asyncio
async def test_a_symlink_to_the_private_file_is_not_opened_saved_through_or_graded(runtime) -> None:
    ws = await desktop(runtime)
    await ok(ws, C("terminal", command=f"ln -s {PRIVATE} ~/link.csv && ln -s /var/lib/desktop ~/dir && "
                                       f"ln -s {PRIVATE} /tmp/link.txt && ls -l ~/link.csv"))
    for tool in ("editor_open", "sheet_open"):
        for path in ("~/link.csv", "/home/user/link.csv", "link.csv", "~/dir/expected/f.txt", "/tmp/link.txt"):
            await refused(ws, C(tool, path=path), "permission denied")
    for path in ("/home/user/link.csv", "/home/agent/dir/expected/f.txt", "/tmp/link.txt"):
        await graded_as_missing(ws, path)
    await ok(ws, C("editor_open", path="~/Documents/meeting_notes.txt"))
    await refused(ws, C("editor_save", path="~/link.csv"), "permission denied")
    await ok(ws, C("sheet_open", path="~/Documents/budget.csv"))
    await refused(ws, C("sheet_save", path="/tmp/link.txt"), "permission denied")
    await private_unchanged(ws)
    assert "Permission denied" in await ok(ws, C("terminal", command="cat ~/link.csv 2>&1; true"))


@pytest.mark.asyncio
async def test_a_fifo_is_an_error_at_once_for_every_tool(runtime) -> None:
    ws = await desktop(runtime)
    await ok(ws, C("terminal", command="mkfifo ~/pipe.csv /tmp/pipe.txt"))
    async with asyncio.timeout(30):  # nothing waits for a writer (or a reader) that never comes
        for tool in ("editor_open", "sheet_open"):
            for path in ("~/pipe.csv", "/tmp/pipe.txt"):
                await refused(ws, C(tool, path=path), "is not a regular file")
        await graded_as_missing(ws, "/home/user/pipe.csv")
        await ok(ws, C("editor_open", path="~/Documents/meeting_notes.txt"))
        await refused(ws, C("editor_save", path="~/pipe.csv"), "pipe.csv")  # no reader: ENXIO, not a hang
        await ok(ws, C("sheet_open", path="~/Documents/budget.csv"))
        await refused(ws, C("sheet_save", path="/tmp/pipe.txt"), "pipe.txt")
    assert await ok(ws, C("terminal", command="echo still-here")) == "still-here\n"


@pytest.mark.asyncio
async def test_a_hard_link_to_a_root_only_file_cannot_be_made_and_would_not_be_handed_out(runtime) -> None:
    ws = await desktop(runtime)
    # the agent cannot name the private file (its directory is 0700)...
    out = await ok(ws, C("terminal", command=f"ln {PRIVATE} ~/hard.txt 2>&1; echo rc=$?"))
    assert "Permission denied" in out and "rc=1" in out
    # ...nor link a root file it can name: fs.protected_hardlinks (a link needs ownership or read+write access)
    if Path("/proc/sys/fs/protected_hardlinks").read_text().strip() == "1":
        out = await ok(ws, C("terminal", command="ln /etc/passwd ~/passwd.txt 2>&1; echo rc=$?"))
        assert "Operation not permitted" in out and "rc=1" in out
    # Were one there anyway (root makes it, through the host's view of the workspace's root), the tools read and
    # write only what the agent itself could open: nothing of a root-only file leaves through them.
    root = f"/proc/{ws.pid}/root"
    os.link(root + PRIVATE, root + "/home/agent/hard.txt")
    assert os.stat(root + "/home/agent/hard.txt").st_nlink == 2
    for tool in ("editor_open", "sheet_open"):
        await refused(ws, C(tool, path="~/hard.txt"), "permission denied")
    await graded_as_missing(ws, "/home/user/hard.txt")
    await ok(ws, C("editor_open", path="~/Documents/meeting_notes.txt"))
    await refused(ws, C("editor_save", path="~/hard.txt"), "permission denied")
    await ok(ws, C("sheet_open", path="~/Documents/budget.csv"))
    await refused(ws, C("sheet_save", path="~/hard.txt"), "permission denied")
    await private_unchanged(ws)


@pytest.mark.asyncio
async def test_dot_dot_never_leaves_the_home_or_tmp(runtime) -> None:
    ws = await desktop(runtime)
    outside = ["~/../../var/lib/desktop/expected/f.txt", "../../var/lib/desktop/expected/f.txt",
               "/home/agent/../../etc/passwd", "/tmp/../var/lib/desktop/expected/f.txt",
               "~/Documents/../../../etc/shadow", "/home/user/../agent/../../root/.profile", "~/.."]
    for tool in ("editor_open", "sheet_open"):
        for path in outside:
            await refused(ws, C(tool, path=path), "permission denied")
    await ok(ws, C("editor_open", path="~/Documents/../Documents/meeting_notes.txt"))  # inside is fine
    await refused(ws, C("editor_save", path="~/../../var/lib/desktop/expected/f.txt"), "permission denied")
    await refused(ws, C("editor_save", path="/tmp/../etc/cron.d/x"), "permission denied")
    await ok(ws, C("sheet_open", path="~/Documents/budget.csv"))
    await refused(ws, C("sheet_save", path="../../var/lib/desktop/expected/f.txt"), "permission denied")
    await private_unchanged(ws)
    assert not os.path.exists(f"/proc/{ws.pid}/root/etc/cron.d/x")


@pytest.mark.asyncio
async def test_an_agent_swapping_a_directory_for_a_symlink_meanwhile_gets_nothing(runtime) -> None:
    """A swapper flips ~/w between a directory and a symlink to the private directory as fast as it can while the
    editor and the grader open ~/w/f.txt: never the private file's bytes."""
    ws = await desktop(runtime)
    await ok(ws, C("terminal", command="mkdir ~/w && echo mine > ~/w/f.txt"))
    await ok(ws, C("terminal", command="nohup sh -c 'while [ ! -e ~/stop ]; do "
                                       "mv ~/w ~/w.real && ln -s /var/lib/desktop/expected ~/w; rm ~/w; "
                                       "mv ~/w.real ~/w; done; touch ~/stopped' >/dev/null 2>&1 &"))
    graded: set[bytes | None] = set()
    loop = asyncio.get_running_loop()
    end = loop.time() + 3
    while loop.time() < end:
        graded.add((await ws.execute(C("_read_file", path="/home/agent/w/f.txt"))).data["content"])
        for tool, close in (("editor_open", "editor_close"), ("sheet_open", "sheet_close")):
            obs = await ws.execute(C(tool, path="~/w/f.txt"))
            assert b"4242" not in (obs.output + repr(obs.data)).encode()
            if obs.error is None:
                await ok(ws, C(close))
    assert SECRET not in graded
    assert None in graded and b"mine\n" in graded  # the swapper ran: the grader saw both states
    # the swapper ends after its current swap (a process of the workspace: polled in its shell)
    await ok(ws, C("terminal", command="touch ~/stop; until [ -e ~/stopped ]; do sleep 0.01; done"))
    await private_unchanged(ws)


# -- the same mechanisms, driven deterministically in this process (as root, under /tmp) -----------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """tmp_path/d/f.txt ("mine", the agent's) and tmp_path/private/f.txt ("SECRET", root-only)."""
    assert str(tmp_path.resolve()).startswith("/tmp/"), "the editor's roots are the home and /tmp"
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f.txt").write_text("mine")
    os.chown(tmp_path / "d" / "f.txt", AGENT_UID, AGENT_UID)
    (tmp_path / "private").mkdir(mode=0o700)
    (tmp_path / "private" / "f.txt").write_text("SECRET")
    os.chmod(tmp_path / "private" / "f.txt", 0o600)
    return tmp_path


def assert_neither_read_nor_written(resolved: str, tree: Path, match: str) -> None:
    """Reading (even as root) and writing ``resolved`` are refused with ``match``; the private file is intact."""
    with pytest.raises(ToolError, match=match):
        files.read_bytes(resolved, as_agent=False)
    with pytest.raises(ToolError, match=match):
        files.write_text(resolved, "overwritten")
    assert (tree / "private" / "f.txt").read_text() == "SECRET"


def test_a_directory_swapped_after_the_check_is_not_followed(tree: Path) -> None:
    resolved = files.resolve_user_path(str(tree / "d" / "f.txt"))  # the check passes: a directory under /tmp
    assert files.read_bytes(resolved) == b"mine"
    (tree / "d").rename(tree / "d.real")  # the swap, between the check and the open
    (tree / "d").symlink_to(tree / "private")
    assert_neither_read_nor_written(resolved, tree, "f.txt")


def test_a_file_swapped_for_a_symlink_after_the_check_is_not_followed(tree: Path) -> None:
    resolved = files.resolve_user_path(str(tree / "d" / "f.txt"))
    (tree / "d" / "f.txt").unlink()
    (tree / "d" / "f.txt").symlink_to(tree / "private" / "f.txt")
    assert_neither_read_nor_written(resolved, tree, "Too many levels of symbolic links")


def test_a_hard_link_to_a_root_only_file_is_read_and_written_only_as_root_may(tree: Path) -> None:
    link = tree / "d" / "linked.txt"
    os.link(tree / "private" / "f.txt", link)
    with pytest.raises(ToolError, match="permission denied"):
        files.read_bytes(str(link))
    with pytest.raises(ToolError, match="permission denied"):
        files.write_text(str(link), "overwritten")
    assert files.read_bytes(str(link), as_agent=False) == b"SECRET"  # the grader's own files: as root
    assert (tree / "private" / "f.txt").read_text() == "SECRET"
    files.write_text(str(tree / "d" / "f.txt"), "edited")  # the agent's own file: fine
    os.chmod(tree / "d" / "f.txt", 0o444)
    with pytest.raises(ToolError, match="permission denied"):  # not even the agent could write it
        files.write_text(str(tree / "d" / "f.txt"), "again")
    assert files.read_bytes(str(tree / "d" / "f.txt")) == b"edited"
    st = os.stat(tree / "d" / "f.txt")
    assert files.agent_may(st, stat.S_IRUSR) and not files.agent_may(st, stat.S_IWUSR)


def test_a_fifo_neither_blocks_a_read_nor_a_write(tree: Path) -> None:
    fifo = tree / "d" / "pipe"
    os.mkfifo(fifo)
    for op in (lambda: files.read_bytes(str(fifo)), lambda: files.write_text(str(fifo), "x")):
        outcome: list[BaseException | None] = []

        def attempt(op=op, outcome=outcome) -> None:
            try:
                op()
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=attempt, daemon=True)
        thread.start()
        thread.join(timeout=5)
        if thread.is_alive():  # blocked opening the FIFO: release it (open the other end), then fail
            os.close(os.open(fifo, os.O_RDWR | os.O_NONBLOCK))
            thread.join(timeout=5)
            pytest.fail("opening a FIFO blocked")
        assert len(outcome) == 1 and isinstance(outcome[0], ToolError), outcome

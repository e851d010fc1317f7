"""The scripted OpenAI-compatible model server (``tests/openai_server.py``) as a fixture: ``openai_server(replies)``
starts one in its own process and stops it after the test (none may be left running). Shared by the policy's tests
and the WebArena judge's."""

from __future__ import annotations

import json
import select
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .conftest import live_processes

REPO = Path(__file__).resolve().parent.parent


@dataclass
class ScriptedServer:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    script: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def requests(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def chat_bodies(self) -> list[dict[str, Any]]:
        return [r["body"] for r in self.requests() if r["method"] == "POST"]


def processes_running(marker: str) -> list[int]:
    """Live processes whose command line names ``marker`` (a test's own script file)."""
    return [pid for pid, cmd, state in live_processes() if marker.encode() in cmd and state != "Z"]


@pytest.fixture
def openai_server(tmp_path: Path) -> Iterator[Callable[..., ScriptedServer]]:
    """Factory: ``server = openai_server(replies, flavor=..., models=...)`` starts the scripted server process;
    every one started is terminated after the test, and none may be left running."""
    started: list[ScriptedServer] = []

    def start(replies: list[dict[str, Any]], *, flavor: str = "vllm", models: list[str] | None = None,
              tool_parser: str = "hermes", max_model_len: int | None = None) -> ScriptedServer:
        n = len(started)
        script, log = tmp_path / f"script-{n}.json", tmp_path / f"requests-{n}.jsonl"
        script.write_text(json.dumps({"replies": replies, **({"models": models} if models is not None else {})}))
        extra = ["--max-model-len", str(max_model_len)] if max_model_len is not None else []
        with open(tmp_path / f"server-{n}.stderr", "wb") as err:
            proc = subprocess.Popen([sys.executable, "-m", "tests.openai_server", "--port", "0", "--script",
                                     str(script), "--log", str(log), "--flavor", flavor, "--tool-parser",
                                     tool_parser, *extra],
                                    cwd=REPO, stdout=subprocess.PIPE, stderr=err)
        server = ScriptedServer(proc=proc, port=0, log=log, script=script)
        started.append(server)
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 20)
        line = proc.stdout.readline() if ready else b""
        if not line.strip().isdigit():
            raise RuntimeError(f"the scripted server did not start: {line!r}; stderr: "
                               f"{(tmp_path / f'server-{n}.stderr').read_text()}")
        server.port = int(line)
        return server

    try:
        yield start
    finally:
        for server in started:
            if server.proc.poll() is None:
                server.proc.terminate()
            try:
                server.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                server.proc.kill()
                server.proc.wait(timeout=5)
            if server.proc.stdout is not None:
                server.proc.stdout.close()
        for server in started:
            assert server.proc.returncode is not None
            assert not processes_running(str(server.script)), f"server process left behind: {server.script}"

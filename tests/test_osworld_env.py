"""OSWorld's own DesktopEnv (desktop-env 1.0.2), its VM a desktop workspace: reset runs a task's config through
OSWorld's SetupController, step runs pyautogui through its PythonController, evaluate judges with OSWorld's
getters and metrics; a second reset reverts to a fresh desktop; nothing is left after close."""

from __future__ import annotations

from pathlib import Path

from bunshin.engine.adapters.osworld_env import desktop_env

from .conftest import host_processes

TASK = {
    "id": "bunshin-note-in-gedit",
    "instruction": "Type the word bunshin at the start of the note open in gedit and save it.",
    "config": [
        {"type": "execute", "parameters": {"command": "mkdir -p ~/Desktop && printf 'draft\\n' > ~/Desktop/note.txt",
                                           "shell": True}},
        {"type": "launch", "parameters": {"command": ["gedit", "/home/agent/Desktop/note.txt"]}},
        {"type": "execute_with_verification", "parameters": {"command": ["true"],
                                                             "verification": {"window_exists": "note.txt"},
                                                             "max_wait_time": 60, "check_interval": 0.5}},
        {"type": "activate_window", "parameters": {"window_name": "note.txt"}},
    ],
    "evaluator": {
        "func": "check_include_exclude",
        "result": {"type": "vm_command_line", "command": "cat ~/Desktop/note.txt", "shell": True},
        "expected": {"type": "rule", "rules": {"include": ["bunshindraft"], "exclude": []}},
    },
}


def test_osworlds_desktop_env_resets_steps_and_evaluates_on_a_desktop_workspace(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = desktop_env(state_dir=state, cache_dir=str(tmp_path / "cache"), action_space="pyautogui")
    try:
        obs = env.reset(task_config=TASK)
        assert obs["screenshot"][:8] == b"\x89PNG\r\n\x1a\n"
        assert obs["instruction"] == TASK["instruction"]
        assert '<application name="gedit"' in obs["accessibility_tree"]
        assert env.evaluate() == 0.0  # nothing done yet: OSWorld's metric says so
        obs, reward, done, info = env.step("pyautogui.typewrite('bunshin'); pyautogui.hotkey('ctrl', 's')", pause=1)
        assert (reward, done) == (0, False)
        assert env.evaluate() == 1.0
        obs = env.reset(task_config=TASK)  # the env was used: reverted to a fresh desktop, the config run again
        assert env.evaluate() == 0.0
        obs, reward, done, info = env.step("FAIL")
        assert done and info == {"fail": True} and env.evaluate() == 0.0
    finally:
        env.close()
        env.provider.close_runtime()
    assert list((state / "runs").iterdir()) == []  # the run's directory, its pool and cgroups are gone
    assert host_processes() == []  # and every workspace host with its desktop

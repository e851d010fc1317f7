"""The osworld suite's embedded tasks: a deterministic generator writing OSWorld-format JSON tasks for the real
desktop, with reference solutions in OSWorld's ``pyautogui`` action space, into
``envs/xdesktop/tasks/<template>/<uuid>.json`` (committed; a test checks they equal what this produces), and the
files they download (``embedded_files``: generated here, put in the files cache by the suite, never committed).

Run ``python -m bunshin.envs.xdesktop.tasks [DIR]`` to (re)write them.

==================  =====================================================  ==========================================
template            what the agent does (application)                      evaluator (getters -> metric)
==================  =====================================================  ==========================================
calc_total          a Total row by formula in an .xlsx, saved as .xlsx     vm_file, cloud_file -> compare_table
                    (LibreOffice Calc)                                     (sheet_data)
writer_title        a title paragraph at the top of a .docx (Writer)       vm_file, cloud_file -> compare_docx_files
gedit_edit          a line at the top or the end of a letter (gedit)       vm_file, cloud_file -> compare_text_file
json_settings       two keys of a JSON settings file (gedit)               vm_file, rule -> check_json
terminal_files      sort ~/Downloads into folders (GNOME Terminal)         vm_command_line, rule -> exact_match
chrome_page         open a local page in the current tab (Chromium as      open_tabs_info, rule -> is_expected_tabs
                    google-chrome, DevTools on 9222)
vlc_play            play a video (VLC, its HTTP interface on 8080)          vlc_playing_info, rule -> is_vlc_playing
infeasible          something this desktop cannot do                       infeasible (correct answer: FAIL)
==================  =====================================================  ==========================================

Files a task downloads and its expected files are ``cloud_file`` URLs under ``FILES_URL`` (a name that resolves
nowhere: only a files cache holding them serves them). Extra keys a real OSWorld file does not have:
``bunshin_template`` and ``bunshin_reference`` (the reference actions, ending with DONE or FAIL).
"""

from __future__ import annotations

import json
import random
import sys
import uuid
from pathlib import Path
from typing import Any

from .office import write_docx, write_xlsx

TASKS_DIR = Path(__file__).parent / "tasks"
NAMESPACE = uuid.UUID("0b9a3a0e-55c4-4c1e-9d6b-3f2c7e1a8d42")
FILES_URL = "https://files.bunshin.invalid/osworld"
PER_TEMPLATE = 3
HOME = "/home/agent"

COMPANIES = ["Acme", "Globex", "Initech", "Umbrella", "Hooli", "Stark Industries", "Wayne Enterprises", "Soylent"]
ITEMS = ["paper", "toner", "pens", "folders", "staples", "binders", "labels", "markers", "envelopes", "tape"]


def _id(template: str, i: int) -> str:
    return str(uuid.uuid5(NAMESPACE, f"{template}/{i}"))


def _url(tid: str, name: str) -> str:
    return f"{FILES_URL}/{tid}/{name}"


def _focus(title: str) -> str:
    """Agent code: wait (up to 30 s: a slow machine's) for a window whose title contains ``title`` and raise it."""
    return ("import subprocess; subprocess.run(['sh', '-c', 'for i in $(seq 300); do wmctrl -a \"$0\" && exit 0; "
            f"sleep 0.1; done; exit 1', {title!r}], check=True); time.sleep(0.5)")


def _save_keeping_format(path: str) -> str:
    """Agent code: Ctrl+S, keep the Office format in LibreOffice's question, wait for the file to change (each
    wait up to 30 s and over as soon as it happens: a slow machine, such as ``kmod/vmtest``'s emulated one, gets time)."""
    return (f"import os, subprocess; before = os.path.getmtime({path!r}); pyautogui.hotkey('ctrl', 's'); "
            "subprocess.run(['sh', '-c', 'for i in $(seq 300); do wmctrl -l | grep -q \"Confirm File Format\" "
            "&& exit 0; sleep 0.1; done'], check=False); time.sleep(0.3); pyautogui.press('enter'); "
            f"[time.sleep(0.1) for _ in range(300) if os.path.getmtime({path!r}) == before]; time.sleep(0.5)")


def _action(code: str) -> dict[str, Any]:
    return {"name": "pyautogui", "args": {"code": code}}


DONE = {"name": "DONE", "args": {}}
FAIL = {"name": "FAIL", "args": {}}


def _task(template: str, i: int, instruction: str, apps: list[str], config: list[dict], evaluator: dict,
          reference: list[dict]) -> dict[str, Any]:
    return {"id": _id(template, i), "snapshot": apps[0], "instruction": instruction, "source": "bunshin-osworld",
            "config": config, "trajectory": "trajectories/", "related_apps": apps, "evaluator": evaluator,
            "bunshin_template": template, "bunshin_reference": reference}


def _download(url: str, path: str) -> dict[str, Any]:
    return {"type": "download", "parameters": {"files": [{"url": url, "path": path}]}}


def _execute(script: str) -> dict[str, Any]:
    return {"type": "execute", "parameters": {"command": ["bash", "-c", script]}}


def _launch(*argv: str) -> dict[str, Any]:
    return {"type": "launch", "parameters": {"command": list(argv)}}


def _sleep(seconds: float) -> dict[str, Any]:
    return {"type": "sleep", "parameters": {"seconds": seconds}}


Files = dict[str, bytes]


def calc_total(i: int, rng: random.Random, files: Files) -> dict:
    tid, name = _id("calc_total", i), f"supplies_{i + 1}.xlsx"
    column = rng.choice(["units", "boxes", "orders"])
    items = rng.sample(ITEMS, rng.randint(4, 7))
    rows: list[list[Any]] = [["item", column]] + [[item, rng.randint(3, 400)] for item in items]
    total = sum(r[1] for r in rows[1:])
    path = f"{HOME}/Documents/{name}"
    files[_url(tid, name)] = write_xlsx(rows)
    files[_url(tid, "expected_" + name)] = write_xlsx(rows + [["Total", total]])
    n = len(rows)
    return _task(
        "calc_total", i,
        f"In the open spreadsheet {name}, add a row below the data with \"Total\" in column A and the sum of the "
        f"{column} column in column B, computed by a formula. Save the file, keeping the Excel format.",
        ["libreoffice_calc"],
        [_download(_url(tid, name), path), {"type": "open", "parameters": {"path": path}}],
        {"func": "compare_table",
         "result": {"type": "vm_file", "path": path, "dest": name},
         "expected": {"type": "cloud_file", "path": _url(tid, "expected_" + name), "dest": "expected_" + name},
         "options": {"rules": [{"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": "EI0"}]}},
        [_action(_focus(name)),
         _action(f"pyautogui.hotkey('ctrl', 'Home'); pyautogui.hotkey('ctrl', 'End'); pyautogui.press('home'); "
                 f"pyautogui.press('down'); pyautogui.write('Total\\t=SUM(B2:B{n})\\n', interval=0.03)"),
         _action(_save_keeping_format(path)), DONE])


def writer_title(i: int, rng: random.Random, files: Files) -> dict:
    tid, company = _id("writer_title", i), COMPANIES[(i * 3) % len(COMPANIES)]
    name = f"memo_{i + 1}.docx"
    body = [f"Dear {company} team,", "", f"Our order number {rng.randint(1000, 9999)} ships next week.",
            "The invoice is attached to this memo.", "", "Kind regards,", "The accounts team"]
    title = f"Memo {i + 1} to {company}"
    path = f"{HOME}/Documents/{name}"
    files[_url(tid, name)] = write_docx(body)
    files[_url(tid, "expected_" + name)] = write_docx([title, *body])
    return _task(
        "writer_title", i,
        f"In the open document {name}, insert the paragraph \"{title}\" as the first line, above everything "
        "else, and save the file, keeping the Word format.",
        ["libreoffice_writer"],
        [_download(_url(tid, name), path), {"type": "open", "parameters": {"path": path}}],
        {"func": "compare_docx_files",
         "result": {"type": "vm_file", "path": path, "dest": name},
         "expected": {"type": "cloud_file", "path": _url(tid, "expected_" + name), "dest": "expected_" + name}},
        [_action(_focus(name)),
         _action(f"pyautogui.hotkey('ctrl', 'Home'); pyautogui.write({title + chr(10)!r}, interval=0.03)"),
         _action(_save_keeping_format(path)), DONE])


def gedit_edit(i: int, rng: random.Random, files: Files) -> dict:
    tid, company = _id("gedit_edit", i), COMPANIES[(i * 5 + 1) % len(COMPANIES)]
    name = f"letter_{i + 1}.txt"
    lines = [f"Dear {company} team,", "", "Thank you for your order of last week.",
             f"The parcel number is {rng.randint(100000, 999999)}.", "", "Kind regards,", "The shop"]
    text = "\n".join(lines) + "\n"
    path = f"{HOME}/Documents/{name}"
    at_top = i % 2 == 0
    line = f"Letter {i + 1} to {company}" if at_top else f"P.S. Our shop closes on day {rng.randint(1, 28)}."
    expected = (line + "\n" + text) if at_top else (text + line + "\n")
    files[_url(tid, name)] = text.encode()
    files[_url(tid, "expected_" + name)] = expected.encode()
    where = "as the first line, at the very top" if at_top else "as a new last line, after the signature"
    keys = (f"pyautogui.hotkey('ctrl', 'Home'); pyautogui.write({line + chr(10)!r}, interval=0.03)" if at_top else
            f"pyautogui.hotkey('ctrl', 'End'); pyautogui.write({chr(10) + line!r}, interval=0.03)")
    return _task(
        "gedit_edit", i,
        f"The letter {name} is open in the text editor. Add the line \"{line}\" {where}, and save it.",
        ["gedit"],
        [_download(_url(tid, name), path), _launch("gedit", path), _sleep(2)],
        {"func": "compare_text_file",
         "result": {"type": "vm_file", "path": path, "dest": name},
         "expected": {"type": "cloud_file", "path": _url(tid, "expected_" + name), "dest": "expected_" + name}},
        [_action(_focus(name)), _action(keys),
         _action("pyautogui.hotkey('ctrl', 's'); time.sleep(1.5)"), DONE])


def json_settings(i: int, rng: random.Random, files: Files) -> dict:
    tid = _id("json_settings", i)
    app = ["notes", "photos", "mailer"][i % 3]
    path = f"{HOME}/.config/{app}/settings.json"
    settings = {"theme": "light", "font_size": rng.choice([10, 11, 12]), "autosave": False,
                "language": rng.choice(["en", "de", "fr"])}
    size = rng.choice([14, 16, 18])
    files[_url(tid, "settings.json")] = (json.dumps(settings, indent=2) + "\n").encode()
    new = {**settings, "theme": "dark", "font_size": size}
    return _task(
        "json_settings", i,
        f"The settings file of the {app} app, {path}, is open in the text editor. Set \"theme\" to \"dark\" and "
        f"\"font_size\" to {size}, keep the other settings as they are, and save it (it must stay valid JSON).",
        ["gedit"],
        [_download(_url(tid, "settings.json"), path), _launch("gedit", path), _sleep(2)],
        {"func": "check_json",
         "result": {"type": "vm_file", "path": path, "dest": "settings.json"},
         "expected": {"type": "rule", "rules": {"expect": [
             {"key": ["theme"], "method": "eq", "ref": "dark"},
             {"key": ["font_size"], "method": "eq", "ref": size},
             {"key": ["language"], "method": "eq", "ref": settings["language"]},
             {"key": ["autosave"], "method": "eq", "ref": False}]}}},
        [_action(_focus("settings.json")),
         _action(f"pyautogui.hotkey('ctrl', 'a'); pyautogui.write({json.dumps(new)!r}, interval=0.02)"),
         _action("pyautogui.hotkey('ctrl', 's'); time.sleep(1.5)"), DONE])


def terminal_files(i: int, rng: random.Random, files: Files) -> dict:
    kinds = {"pdf": "Documents", "jpg": "Pictures", "mp3": "Music"}
    chosen = list(kinds.items())[: 2 + i % 2]
    names = [f"{word}_{n}.{ext}" for ext, _ in chosen for n, word in enumerate(rng.sample(ITEMS, 2))]
    names.append(f"notes_{i}.txt")
    create = "mkdir -p ~/Downloads && cd ~/Downloads && touch " + " ".join(sorted(names))
    moves = " && ".join(f"mkdir -p {folder} && mv *.{ext} {folder}/" for ext, folder in chosen)
    listing = sorted(f"./{folder}/{n}" for ext, folder in chosen for n in names if n.endswith("." + ext))
    listing += [f"./{n}" for n in names if n.endswith(".txt")]
    expected = "\n".join(sorted(listing)) + "\n"
    rule = ", ".join(f"every .{ext} file into ~/Downloads/{folder}" for ext, folder in chosen)
    return _task(
        "terminal_files", i,
        f"Using the terminal, move {rule} (create the folders). Leave the other files where they are.",
        ["os"],
        [_execute(create), _launch("gnome-terminal", "--working-directory", f"{HOME}/Downloads"), _sleep(2)],
        {"func": "exact_match",
         "result": {"type": "vm_command_line",
                    "command": ["bash", "-c", f"cd {HOME}/Downloads && find . -type f | LC_ALL=C sort"]},
         "expected": {"type": "rule", "rules": {"expected": expected}}},
        [_action(_focus("Terminal")),
         _action(f"pyautogui.write({'cd ~/Downloads && ' + moves + chr(10)!r}, interval=0.02); time.sleep(1)"),
         DONE])


def chrome_page(i: int, rng: random.Random, files: Files) -> dict:
    tid = _id("chrome_page", i)
    pages = ["report", "pricing", "contact", "schedule"]
    name = pages[i % len(pages)]
    url = f"file://{HOME}/Documents/site/{name}.html"
    config = []
    for page in pages:
        html = (f"<!DOCTYPE html><html><head><title>{page.title()}</title></head><body><h1>{page.title()}</h1>"
                f"<p>{' '.join(pg for pg in pages if pg != page)}</p></body></html>")
        files[_url(tid, page + ".html")] = html.encode()
        config.append(_download(_url(tid, page + ".html"), f"{HOME}/Documents/site/{page}.html"))
    config += [_launch("google-chrome", "--remote-debugging-port=1337"),
               _launch("socat", "tcp-listen:9222,fork", "tcp:localhost:1337"), _sleep(3)]
    return _task(
        "chrome_page", i,
        f"In Chrome, open the local page {url} in the current tab.",
        ["chrome"], config,
        {"func": "is_expected_tabs",
         "result": {"type": "open_tabs_info"},
         "expected": {"type": "rule", "rules": {"type": "url", "urls": [url]}}},
        [_action(_focus("Chromium")),
         _action(f"pyautogui.hotkey('ctrl', 'l'); time.sleep(0.3); pyautogui.write({url + chr(10)!r}, "
                 "interval=0.02); time.sleep(2)"), DONE])


def vlc_play(i: int, rng: random.Random, files: Files) -> dict:
    name = f"{['holiday', 'lecture', 'concert'][i % 3]}_{i + 1}.mp4"
    path = f"{HOME}/Videos/{name}"
    color = rng.choice(["blue", "green", "orange"])
    make = (f"mkdir -p ~/Videos && ffmpeg -loglevel error -y -f lavfi -i color=c={color}:s=160x120:r=5 -t 900 "
            f"-pix_fmt yuv420p {path}")
    return _task(
        "vlc_play", i,
        f"Play the video {path} in VLC media player (it is open).",
        ["vlc"],
        [_execute(make), _launch("vlc", "--extraintf", "http", "--http-host", "127.0.0.1", "--http-port", "8080",
                                 "--http-password", "password", "--no-qt-privacy-ask"), _sleep(3)],
        {"func": "is_vlc_playing",
         "result": {"type": "vlc_playing_info", "dest": "status.xml"},
         "expected": {"type": "rule", "rules": {"type": "file_name", "file_name": name}}},
        [_action(_focus("VLC")),
         _action("pyautogui.hotkey('ctrl', 'o'); time.sleep(2)"),
         _action(f"pyautogui.write({path + chr(10)!r}, interval=0.02); time.sleep(2)"), DONE])


INFEASIBLE = [
    ("Install the Python extension in Visual Studio Code.", ["os"]),
    ("Open the spreadsheet in Microsoft Excel and turn on its Copilot assistant.", ["libreoffice_calc"]),
    ("Print the open letter on the office printer named HP-4th-floor.", ["gedit"]),
]


def infeasible(i: int, rng: random.Random, files: Files) -> dict:
    instruction, apps = INFEASIBLE[i % len(INFEASIBLE)]
    return _task("infeasible", i, instruction, apps, [], {"func": "infeasible"}, [FAIL])


TEMPLATES = [calc_total, writer_title, gedit_edit, json_settings, terminal_files, chrome_page, vlc_play, infeasible]


def generate() -> tuple[dict[str, str], Files]:
    """Every task file's relative path and JSON text, and every file they download (URL -> bytes)."""
    out: dict[str, str] = {}
    files: Files = {}
    for template in TEMPLATES:
        rng = random.Random(f"osworld/{template.__name__}")
        for i in range(PER_TEMPLATE):
            task = template(i, rng, files)
            out[f"{template.__name__}/{task['id']}.json"] = json.dumps(task, indent=2) + "\n"
    return out, files


def embedded_files() -> Files:
    """The files the embedded tasks download or compare against (URL -> bytes)."""
    return generate()[1]


def write(directory: Path) -> int:
    tasks, _ = generate()
    for rel, text in tasks.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return len(tasks)


if __name__ == "__main__":
    print(write(Path(sys.argv[1]) if len(sys.argv) > 1 else TASKS_DIR), "tasks written")

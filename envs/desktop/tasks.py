"""The desktop's task files: a deterministic generator writing OSWorld-format JSON tasks, with reference solutions,
into ``envs/desktop/tasks/<template>/<uuid>.json`` (committed; a test checks they equal what this produces).

Run ``python -m bunshin.envs.desktop.tasks [DIR]`` to (re)write them.

Templates (8 tasks each, 72 in all):

=================  ================================================  ==============================================
template           what the agent does                               evaluator (getters -> metrics)
=================  ================================================  ==============================================
sheet_total        add a Total/Average/Maximum row by formula,       vm_file, vm_file (private expected) ->
                   save as a new CSV                                 compare_csv
sheet_formula      add an ``amount = qty * price`` column, save       vm_file, vm_file -> compare_table
json_config        change keys of a JSON config in the editor         vm_file, rule -> check_json
text_edit          replace a name / delete a draft line / insert a    vm_file, vm_file -> compare_text_file
                   title in a document
ini_setting        change one INI value                               vm_command_line, rule -> exact_match
organize_files     sort ~/Downloads into folders by type              list_directory, rule -> exact_match
project_tests      fix a bug in ~/project and run its tests (the      vm_command_line, vm_terminal_output, rule ->
                   test suite takes ~1.5 s; evaluation runs it too)   check_include_exclude x2, exact_match
log_query          answer a question about a 20 MB log with grep,     vm_command_line, rule -> exact_match
                   awk, sort (setup generates the log, ~1 s)
infeasible         something the desktop cannot do                    infeasible (correct answer: FAIL)
=================  ================================================  ==============================================

Extra keys a real OSWorld file does not have (and our loader reads): ``bunshin_template``, ``bunshin_reference``
(the reference tool calls, ending with DONE or FAIL), ``bunshin_private_files`` (expected files the suite writes
root-only under /var/lib/desktop before setup: the agent cannot read them).
"""

from __future__ import annotations

import collections
import json
import random
import sys
import uuid
from pathlib import Path
from typing import Any

from .app import PRIVATE_DIR
from .spreadsheet import Sheet

HOME = "/home/agent"
NAMESPACE = uuid.UUID("5b1f4d0e-7a43-4c39-9f59-0d3a2b8e6c11")
PER_TEMPLATE = 8

WRITE_FILES = ("import json, os, sys\n"
               "for p, c in json.loads(sys.argv[1]).items():\n"
               "    os.makedirs(os.path.dirname(p), exist_ok=True)\n"
               "    with open(p, 'w') as f:\n"
               "        f.write(c)\n")

REPLACE_ONCE = ("import sys\n"
                "p, a, b = sys.argv[1:]\n"
                "s = open(p).read()\n"
                "assert a in s, 'pattern not found'\n"
                "open(p, 'w').write(s.replace(a, b, 1))\n")

LOG_SCRIPT = r'''import random, sys
SERVICES = ["auth", "billing", "search", "cart", "media", "mail"]
LEVELS = ["INFO"] * 14 + ["WARN"] * 4 + ["ERROR"] * 2
METHODS = ["GET"] * 6 + ["POST"] * 3 + ["DELETE"]
PATHS = ["/api/login", "/api/logout", "/api/items", "/api/cart", "/api/pay", "/api/search", "/static/app.js",
         "/img/logo.png"]
STATUSES = [200] * 12 + [201, 204, 301, 304, 400, 401, 403, 404, 404, 500, 502, 503]
def lines(n, seed):
    rng = random.Random(seed)
    t = 1709251200
    for _ in range(n):
        t += rng.randrange(3)
        ip = "10.%d.%d.%d" % (rng.randrange(4), rng.randrange(16), rng.randrange(1, 40))
        yield "%d %s [%s] %s %s %s %d %d\n" % (t, rng.choice(LEVELS), rng.choice(SERVICES), ip, rng.choice(METHODS),
                                              rng.choice(PATHS), rng.choice(STATUSES), rng.randrange(100, 50000))
if __name__ == "__main__":
    path, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with open(path, "w") as f:
        f.writelines(lines(n, seed))
'''
LOG_LINES, LOG_SEED = 300_000, 20240301
LOG_PATH = f"{HOME}/logs/server.log"


def _id(template: str, i: int) -> str:
    return str(uuid.uuid5(NAMESPACE, f"{template}/{i}"))


def write_files_step(files: dict[str, str]) -> dict[str, Any]:
    return {"type": "execute", "parameters": {"command": ["python3", "-c", WRITE_FILES, json.dumps(files)]}}


def call(name: str, **args: Any) -> dict[str, Any]:
    return {"name": name, "args": args}


DONE = call("DONE")


def task(template: str, i: int, instruction: str, config: list[dict], evaluator: dict, reference: list[dict],
         snapshot: str, apps: list[str], private: dict[str, str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": _id(template, i), "snapshot": snapshot, "instruction": instruction, "source": "bunshin-desktop",
        "config": config, "trajectory": "trajectories/", "related_apps": apps, "evaluator": evaluator,
        "bunshin_template": template, "bunshin_reference": reference,
    }
    if private:
        out["bunshin_private_files"] = private
    return out


def _expected_path(tid: str, suffix: str) -> str:
    return f"{PRIVATE_DIR}/expected/{tid}{suffix}"


# -- templates --------------------------------------------------------------------------------------------------------

REGIONS = ["north", "south", "east", "west", "central", "coast", "valley", "harbor", "hills", "lakes"]


def sheet_total(i: int, rng: random.Random) -> dict:
    kind, func = [("Total", "SUM"), ("Average", "AVERAGE"), ("Maximum", "MAX")][i % 3]
    rows = rng.randint(5, 12)
    names = rng.sample(REGIONS, min(rows, len(REGIONS))) + [f"zone{k}" for k in range(rows - len(REGIONS))]
    body = [f"{names[k]},{rng.randint(100, 9999)}" for k in range(rows)]
    text = "region,sales\n" + "\n".join(body) + "\n"
    src, dst = f"{HOME}/Documents/sales_{i}.csv", f"{HOME}/Documents/sales_{i}_{kind.lower()}.csv"
    last = rows + 1
    steps = [call("sheet_open", path=src), call("sheet_set", cell=f"A{last + 1}", value=kind),
             call("sheet_set", cell=f"B{last + 1}", value=f"={func}(B2:B{last})"), call("sheet_save", path=dst), DONE]
    sheet = Sheet.from_csv(text)
    sheet.set(f"A{last + 1}", kind)
    sheet.set(f"B{last + 1}", f"={func}(B2:B{last})")
    tid = _id("sheet_total", i)
    expected = _expected_path(tid, ".csv")
    return task("sheet_total", i,
                f"In the spreadsheet ~/Documents/sales_{i}.csv (already open), add a row below the data with "
                f"\"{kind}\" in column A and the {kind.lower()} of the sales column in column B, computed by a "
                f"formula. Save the sheet as CSV to ~/Documents/sales_{i}_{kind.lower()}.csv.",
                [write_files_step({src: text}), {"type": "open", "parameters": {"path": src}}],
                {"func": "compare_csv", "result": {"type": "vm_file", "path": dst, "dest": "result.csv"},
                 "expected": {"type": "vm_file", "path": expected, "dest": "expected.csv"}},
                steps, "libreoffice_calc", ["libreoffice_calc"], {expected: sheet.to_csv()})


ITEMS = ["pens", "paper", "stapler", "toner", "folders", "tape", "markers", "envelopes", "labels", "clips"]


def sheet_formula(i: int, rng: random.Random) -> dict:
    rows = rng.randint(4, 9)
    items = rng.sample(ITEMS, rows)
    body = [f"{items[k]},{rng.randint(1, 40)},{rng.randint(50, 2500) / 100:g}" for k in range(rows)]
    text = "item,qty,price\n" + "\n".join(body) + "\n"
    path = f"{HOME}/Documents/order_{i}.csv"
    steps = [call("sheet_open", path=path), call("sheet_set", cell="D1", value="amount")]
    sheet = Sheet.from_csv(text)
    sheet.set("D1", "amount")
    for r in range(2, rows + 2):
        steps.append(call("sheet_set", cell=f"D{r}", value=f"=B{r}*C{r}"))
        sheet.set(f"D{r}", f"=B{r}*C{r}")
    steps += [call("sheet_save"), DONE]
    tid = _id("sheet_formula", i)
    expected = _expected_path(tid, ".csv")
    return task("sheet_formula", i,
                f"Open ~/Documents/order_{i}.csv in the spreadsheet. Add a column D with the header \"amount\" "
                f"holding qty times price for every item (use formulas), then save the file in place as CSV.",
                [write_files_step({path: text}), {"type": "sleep", "parameters": {"seconds": 0.1}}],
                {"func": "compare_table", "result": {"type": "vm_file", "path": path, "dest": f"order_{i}.csv"},
                 "expected": {"type": "vm_file", "path": expected, "dest": "expected.csv"}},
                steps, "libreoffice_calc", ["libreoffice_calc"], {expected: sheet.to_csv()})


SERVICES = ["gateway", "indexer", "mailer", "scheduler", "thumbnailer", "billing", "reports", "auth"]


def json_config(i: int, rng: random.Random) -> dict:
    name = SERVICES[i]
    data = {"name": name, "port": 8000 + 10 * i, "debug": True, "log_level": "info", "workers": rng.randint(2, 6),
            "features": {"cache": False, "beta": True}}
    text = json.dumps(data, indent=2) + "\n"
    path = f"{HOME}/config/{name}.json"
    changes = [
        ("set \"debug\" to false", '"debug": true', '"debug": false', ["debug"], False),
        (f"change \"port\" to {9000 + i}", f'"port": {data["port"]}', f'"port": {9000 + i}', ["port"], 9000 + i),
        ("set \"log_level\" to \"warning\"", '"log_level": "info"', '"log_level": "warning"', ["log_level"], "warning"),
        ("turn the \"cache\" feature on", '"cache": false', '"cache": true', ["features", "cache"], True),
    ]
    picked = [changes[i % 4], changes[(i + 1) % 4]] if i >= 4 else [changes[i % 4]]
    steps = [call("editor_open", path=path)]
    steps += [call("editor_replace", find=a, replace=b) for _, a, b, _, _ in picked]
    steps += [call("editor_save"), DONE]
    rules = {"expect": [{"key": key, "method": "eq", "ref": ref} for *_, key, ref in picked]
             + [{"key": ["name"], "method": "eq", "ref": name}]}
    return task("json_config", i,
                f"In the configuration file ~/config/{name}.json, {' and '.join(p[0] for p in picked)}. Keep the "
                f"file valid JSON and leave the other settings as they are.",
                [write_files_step({path: text}), {"type": "launch", "parameters": {"command": ["gedit", path]}}],
                {"func": "check_json", "result": {"type": "vm_file", "path": path, "dest": f"{name}.json"},
                 "expected": {"type": "rule", "rules": rules}},
                steps, "gedit", ["gedit"])


COMPANIES = [("Acme Corp", "Globex Ltd"), ("Initech", "Umbrella Inc"), ("Stark Industries", "Wayne Enterprises"),
             ("Hooli", "Pied Piper"), ("Soylent", "Tyrell Corp"), ("Cyberdyne", "Aperture Labs"),
             ("Wonka Ltd", "Oceanic Air"), ("Vandelay", "Kramerica")]
SENTENCES = ["Thank you for your order of last week.", "The invoice is attached to this letter.",
             "Please confirm the delivery date at your convenience.", "Our team will visit your office next month.",
             "The contract renews automatically every year.", "Questions can be sent to our support desk.",
             "We appreciate your continued business.", "The new price list takes effect in March."]


def text_edit(i: int, rng: random.Random) -> dict:
    old, new = COMPANIES[i]
    body = rng.sample(SENTENCES, 6)
    lines = [f"Dear {old} team,", ""]
    for k, s in enumerate(body):
        lines.append(s if k % 2 else f"{s} {old} has been a valued partner.")
    lines += ["", "DRAFT - do not send", "Kind regards,", f"The {old} account team", ""]
    text = "\n".join(lines)
    path = f"{HOME}/Documents/letter_{i}.txt"
    mode = i % 3
    if mode == 0:
        what = f"replace every occurrence of \"{old}\" with \"{new}\""
        steps = [call("editor_replace", find=old, replace=new)]
        expected_text = text.replace(old, new)
    elif mode == 1:
        what = "delete the line \"DRAFT - do not send\""
        n = lines.index("DRAFT - do not send") + 1
        steps = [call("editor_delete_lines", start=n)]
        expected_text = "\n".join(lines[:n - 1] + lines[n:])
    else:
        title = f"Letter {i + 1} to {old}"
        what = f"insert the title line \"{title}\" followed by an empty line at the very top"
        steps = [call("editor_insert", line=1, text=title + "\n")]
        expected_text = title + "\n\n" + text
    tid = _id("text_edit", i)
    expected = _expected_path(tid, ".txt")
    return task("text_edit", i,
                f"Open the letter ~/Documents/letter_{i}.txt in the text editor, {what}, and save it.",
                [write_files_step({path: text})],
                {"func": "compare_text_file", "result": {"type": "vm_file", "path": path, "dest": "letter.txt"},
                 "expected": {"type": "vm_file", "path": expected, "dest": "expected.txt"}},
                [call("editor_open", path=path), *steps, call("editor_save"), DONE], "gedit", ["gedit"],
                {expected: expected_text})


def ini_setting(i: int, rng: random.Random) -> dict:
    name = ["db", "cache", "queue", "search", "storage", "metrics", "proxy", "backup"][i]
    port, timeout, user = 5400 + i, rng.randint(5, 60), f"svc_{name}"
    text = (f"[server]\nhost = 127.0.0.1\nport = {port}\ntimeout = {timeout}\n\n"
            f"[auth]\nuser = {user}\nmethod = password\n")
    path = f"{HOME}/config/{name}.ini"
    choices = [("server", "port", str(port), str(port + 100)),
               ("server", "timeout", str(timeout), str(timeout * 2)),
               ("auth", "method", "password", "token"),
               ("server", "host", "127.0.0.1", "0.0.0.0")]
    section, key, old, new = choices[i % 4]
    script = (f"import configparser; c = configparser.ConfigParser(); c.read({path!r}); "
              f"print(c[{section!r}][{key!r}], end='')")
    return task("ini_setting", i,
                f"In ~/config/{name}.ini, set \"{key}\" in the [{section}] section to {new} and save the file.",
                [write_files_step({path: text})],
                {"func": "exact_match", "result": {"type": "vm_command_line", "command": ["python3", "-c", script]},
                 "expected": {"type": "rule", "rules": {"expected": new}}},
                [call("editor_open", path=path), call("editor_replace", find=f"{key} = {old}", replace=f"{key} = {new}"),
                 call("editor_save"), DONE], "gedit", ["gedit", "terminal"])


def organize_files(i: int, rng: random.Random) -> dict:
    kinds = [("pdf", "pdfs"), ("png", "images"), ("csv", "sheets"), ("txt", "notes")]
    a, b = kinds[i % 4], kinds[(i + 1 + i // 4) % 4]
    stems = ["report", "invoice", "photo", "scan", "summary", "draft", "budget", "plan", "memo", "chart"]
    files = {}
    for ext in ("pdf", "png", "csv", "txt"):
        for stem in rng.sample(stems, rng.randint(2, 4)):
            files[f"{HOME}/Downloads/{stem}_{ext}{i}.{ext}"] = f"{stem} {ext}\n"
    tree: dict[str, Any] = {"name": "Downloads", "type": "directory", "children": []}
    moved = {a[0]: a[1], b[0]: b[1]}
    names = sorted(p.rsplit("/", 1)[1] for p in files)
    children: list[dict] = [{"name": n, "type": "file"} for n in names if n.rsplit(".", 1)[1] not in moved]
    for ext, folder in moved.items():
        children.append({"name": folder, "type": "directory",
                         "children": [{"name": n, "type": "file"} for n in names if n.endswith("." + ext)]})
    tree["children"] = sorted(children, key=lambda c: c["name"])
    cmd = (f"cd ~/Downloads && mkdir -p {a[1]} {b[1]} && mv *.{a[0]} {a[1]}/ && mv *.{b[0]} {b[1]}/ && ls -R")
    return task("organize_files", i,
                f"Tidy up ~/Downloads: move every .{a[0]} file into a new folder ~/Downloads/{a[1]} and every "
                f".{b[0]} file into a new folder ~/Downloads/{b[1]}. Leave all other files where they are.",
                [write_files_step(files)],
                {"func": "exact_match", "result": {"type": "list_directory", "path": f"{HOME}/Downloads"},
                 "expected": {"type": "rule", "rules": {"expected": tree}}},
                [call("terminal", command=cmd), DONE], "os", ["os", "terminal"])


BUGS = [
    ("calc/ops.py", "    return a + b\n", "    return a - b\n"),
    ("calc/ops.py", "    return a * b\n", "    return a * b + 1\n"),
    ("calc/ops.py", "min(x, hi)", "min(x, lo)"),
    ("calc/ops.py", "n % 2 == 0", "n % 2 == 1"),
    ("calc/stats.py", "total(xs) / len(xs)", "total(xs) / (len(xs) - 1)"),
    ("calc/stats.py", "        return ys[mid]\n", "        return ys[mid - 1]\n"),
    ("calc/ops.py", "    return a - b\n", "    return b - a\n"),
    ("calc/stats.py", "if ops.is_even(x)", "if not ops.is_even(x)"),
]


def project_tests(i: int, rng: random.Random) -> dict:
    import hashlib

    from .home import TEST_OPS, TEST_STATS

    rel, good, bad = BUGS[i]
    path = f"{HOME}/project/{rel}"
    hashes = "".join(hashlib.sha256(t.encode()).hexdigest() + "\n" for t in (TEST_OPS, TEST_STATS))
    # -I: the interpreter isolated from the project directory, user site and PYTHON* variables, so a fake
    # `unittest` module left in ~/project or ~/.local cannot answer for the real test run
    run_tests = ["sh", "-c", "cd /home/agent/project && python3 -I -m unittest discover -s tests -t . 2>&1 | tail -n 3"]
    check_tests = ["sh", "-c", "cd /home/agent/project && sha256sum tests/test_ops.py tests/test_stats.py | cut -c1-64"]
    return task("project_tests", i,
                "The unit tests of the Python project in ~/project fail. Find and fix the bug in the package "
                "`calc` (do not change the tests), then run the whole test suite in the terminal "
                "(python3 -m unittest, from ~/project) and make sure that it passes.",
                [{"type": "execute", "parameters": {"command": ["python3", "-c", REPLACE_ONCE, path, good, bad]}}],
                {"func": ["check_include_exclude", "check_include_exclude", "exact_match"],
                 "result": [{"type": "vm_command_line", "command": run_tests},
                            {"type": "vm_terminal_output"},
                            {"type": "vm_command_line", "command": check_tests}],
                 "expected": [{"type": "rule", "rules": {"include": ["OK"], "exclude": ["FAILED", "Error"]}},
                              {"type": "rule", "rules": {"include": ["Ran 6 tests", "\nOK"]}},
                              {"type": "rule", "rules": {"expected": hashes}}]},
                [call("terminal", command="cd ~/project && python3 -m unittest 2>&1 | tail -n 5"),
                 call("editor_open", path=path), call("editor_replace", find=bad, replace=good, count=1),
                 call("editor_save"), call("terminal", command="python3 -m unittest"), DONE],
                "vscode", ["vscode", "terminal"])


def _log_facts() -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "bunshin_log"}
    exec(compile(LOG_SCRIPT, "log_script", "exec"), namespace)  # our own generator, the same code setup runs
    errors_by_service: collections.Counter[str] = collections.Counter()
    status: collections.Counter[int] = collections.Counter()
    error_ips: set[str] = set()
    ips: collections.Counter[str] = collections.Counter()
    bytes_search_200 = 0
    paths_500: collections.Counter[str] = collections.Counter()
    post_pay = 0
    for line in namespace["lines"](LOG_LINES, LOG_SEED):
        _, level, svc, ip, method, path, st, size = line.split()
        st_i = int(st)
        status[st_i] += 1
        ips[ip] += 1
        if level == "ERROR":
            errors_by_service[svc] += 1
            error_ips.add(ip)
        if svc == "[search]" and st_i == 200:
            bytes_search_200 += int(size)
        if st_i == 500:
            paths_500[path] += 1
        if method == "POST" and path == "/api/pay":
            post_pay += 1
    top_ip = ips.most_common(2)
    top_path = paths_500.most_common(2)
    assert top_ip[0][1] > top_ip[1][1] and top_path[0][1] > top_path[1][1], "the questions need unique answers"
    return {"auth": errors_by_service["[auth]"], "billing": errors_by_service["[billing]"], "503": status[503],
            "error_ips": len(error_ips), "top_ip": top_ip[0][0], "bytes": bytes_search_200,
            "top_path": top_path[0][0], "post_pay": post_pay}


_facts: dict[str, Any] | None = None


def log_query(i: int, rng: random.Random) -> dict:
    global _facts
    if _facts is None:
        _facts = _log_facts()
    f = _facts
    questions = [
        ("How many ERROR lines does the auth service ([auth]) have?", "auth",
         "grep -c ' ERROR \\[auth\\] ' logs/server.log > answer.txt"),
        ("How many ERROR lines does the billing service ([billing]) have?", "billing",
         "grep -c ' ERROR \\[billing\\] ' logs/server.log > answer.txt"),
        ("How many requests got the HTTP status 503?", "503",
         "awk '$7 == 503' logs/server.log | wc -l > answer.txt"),
        ("How many distinct client IP addresses appear on ERROR lines?", "error_ips",
         "awk '$2 == \"ERROR\" {print $4}' logs/server.log | sort -u | wc -l > answer.txt"),
        ("Which client IP address made the most requests?", "top_ip",
         "awk '{print $4}' logs/server.log | sort | uniq -c | sort -rn | head -n 1 | awk '{print $2}' > answer.txt"),
        ("What is the sum of the last field (response bytes) over the [search] service's requests with status "
         "200?", "bytes", "awk '$3 == \"[search]\" && $7 == 200 {s += $8} END {print s}' logs/server.log > answer.txt"),
        ("Which request path got the most responses with status 500?", "top_path",
         "awk '$7 == 500 {print $6}' logs/server.log | sort | uniq -c | sort -rn | head -n 1 | awk '{print $2}' "
         "> answer.txt"),
        ("How many POST requests were made to /api/pay?", "post_pay",
         "awk '$5 == \"POST\" && $6 == \"/api/pay\"' logs/server.log | wc -l > answer.txt"),
    ]
    question, key, command = questions[i]
    return task("log_query", i,
                f"The web server's log is ~/logs/server.log (fields: time, level, [service], client IP, method, "
                f"path, status, bytes). {question} Write just the answer into ~/answer.txt.",
                [{"type": "execute", "parameters": {"command": ["mkdir", "-p", f"{HOME}/logs"]}},
                 {"type": "execute", "parameters": {"command": ["python3", "-c", LOG_SCRIPT, LOG_PATH,
                                                                str(LOG_LINES), str(LOG_SEED)]}}],
                {"func": "exact_match",
                 "result": {"type": "vm_command_line",
                            "command": ["sh", "-c", f"tr -d '[:space:]' < {HOME}/answer.txt"]},
                 "expected": {"type": "rule", "rules": {"expected": str(f[key])}}},
                [call("terminal", command=command, timeout_s=120), DONE], "terminal", ["terminal"])


INFEASIBLE = [
    "Open ~/Documents/budget.csv in LibreOffice Impress and turn it into a slide deck with a pie chart.",
    "Connect this computer to the Wi-Fi network \"Office-5G\" with the password in ~/config/app.ini.",
    "Print ~/Documents/meeting_notes.txt on the office printer on the second floor.",
    "Install Adobe Photoshop and use it to crop the company logo.",
    "Pair the Bluetooth headphones \"JBL Tune 510\" with this computer.",
    "Send ~/Documents/contacts.csv to ana@example.org with Thunderbird.",
    "Change the monitor's refresh rate to 144 Hz in the display settings.",
    "Join the video call in the calendar invitation and share the screen.",
]


def infeasible(i: int, rng: random.Random) -> dict:
    return task("infeasible", i, INFEASIBLE[i], [], {"func": "infeasible"}, [call("FAIL")], "os", ["os"])


TEMPLATES = {
    "sheet_total": sheet_total, "sheet_formula": sheet_formula, "json_config": json_config, "text_edit": text_edit,
    "ini_setting": ini_setting, "organize_files": organize_files, "project_tests": project_tests,
    "log_query": log_query, "infeasible": infeasible,
}


def generate() -> dict[str, str]:
    """Relative path -> file text of every task file (deterministic)."""
    out = {}
    for name, make in TEMPLATES.items():
        for i in range(PER_TEMPLATE):
            rng = random.Random(f"{name}/{i}")
            data = make(i, rng)
            out[f"{name}/{data['id']}.json"] = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    return out


def write(directory: Path) -> int:
    files = generate()
    for rel, text in files.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for path in directory.glob("*/*.json"):  # a task a template no longer makes
        if str(path.relative_to(directory)) not in files:
            path.unlink()
    return len(files)


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "tasks"
    print(f"wrote {write(target)} task files to {target}")

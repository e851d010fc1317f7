"""The grounded policy's desktop reader: decides each action from the instruction and what the terminal, the editor
and the spreadsheet showed, never from the task's reference or its files.

Owns: ``act(ctx)``, the next action in the desktop suite's language. The instruction is understood by patterns (a
model understands it; the reader knows the phrasings of requests it can carry out, as a prompt would describe the
desktop's tools and conventions) and becomes a plan: a sequence of tagged steps, each computed from the
observations of the earlier ones. What a step needs is read: a sheet's header and last row before a formula, a
JSON key's line before rewriting it, the listing of a folder before moving its files, the failing tests and the
package's sources before trying a fix (``desktop_repair``), a count the terminal printed before writing the answer.
Edits in the editor are read back before saving. An instruction it has no plan for is checked against the
desktop (``command -v`` for the programs it needs, files it names): giving up (FAIL) only when what it reads shows
the task cannot be done.
Per-rollout memory is ``ctx.extra["grounded_desktop_log"]``: (step, tag, action) of every action it chose; a
step's observation is the one that followed it, so detours between steps (a ``WAIT``, ``terminal: pwd``) are
skipped over, and an action the caller did not take is chosen again.
Must never: read ``ctx.reference``, a task file, the task generator or the evaluator; run anything itself (commands
run in the workspace's terminal).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable

from bunshin.policies.base import PolicyContext

from . import desktop_reading as rd
from . import desktop_repair as rp

MEMORY = "grounded_desktop_log"
Step = tuple[str, str]  # (tag, action); the final actions have the tag ""
DONE: Step = ("", "DONE")
FAIL: Step = ("", "FAIL")
Seen = dict[str, str]  # tag -> the observation that followed the step
FUNCTIONS = {"total": "SUM", "sum": "SUM", "average": "AVERAGE", "mean": "AVERAGE", "maximum": "MAX", "max": "MAX",
             "minimum": "MIN", "min": "MIN", "count": "COUNT"}  # the spreadsheet's functions (its tool's doc)
OPERATORS = {"times": "*", "plus": "+", "minus": "-", "divided by": "/"}


def act(ctx: PolicyContext) -> str:
    """The next action for the rollout ``ctx`` describes."""
    log = [entry for entry in ctx.extra.get(MEMORY, []) if entry[0] < ctx.step]  # steps actually taken
    seen = {tag: ctx.observations[step + 1] for step, tag, text in log
            if step < len(ctx.actions) and ctx.actions[step] == text and step + 1 < len(ctx.observations)}
    tag, action = plan(ctx.instruction)(seen)
    if tag:
        log.append((ctx.step, tag, action))
    ctx.extra[MEMORY] = log
    return action


def plan(instruction: str) -> Callable[[Seen], Step]:
    """The plan for ``instruction``: a function from what its steps observed to its next step."""
    text = " ".join(instruction.split())
    for pattern, make in PLANS:
        m = pattern.search(text)
        if m:
            return lambda seen: make(m.groupdict(), seen)
    return lambda seen: probe(text, seen)


def first(seen: Seen, *steps: Step) -> Step | None:
    """The first of ``steps`` not taken yet."""
    return next((s for s in steps if s[0] not in seen), None)


# -- spreadsheet --------------------------------------------------------------------------------------------------


def sheet_total(m: dict[str, str], seen: Seen) -> Step:
    if s := first(seen, ("open", f"sheet_open: {m['src']}")):
        return s
    rows = rd.table(seen["open"])
    func = FUNCTIONS.get(m["what"].lower())
    col = rd.find_column(rows[0], m["column"]) if rows else None
    if rows is None or func is None or col is None or rd.last_row_with(rows, col) < 2:
        return FAIL
    letter, last = rd.column_letter(col), rd.last_row_with(rows, col)
    below = max(rd.last_row_with(rows, c) for c in range(max(len(r) for r in rows))) + 1
    return first(seen, ("label", rd.call("sheet_set", cell=f"{m['label_col']}{below}", value=m["label"])),
                 ("value", rd.call("sheet_set", cell=f"{m['value_col']}{below}", value=f"={func}({letter}2:{letter}{last})")),
                 ("save", rd.call("sheet_save", path=m["dst"]))) or finish(seen, "save")


def sheet_formula(m: dict[str, str], seen: Seen) -> Step:
    if s := first(seen, ("open", f"sheet_open: {m['path']}")):
        return s
    rows = rd.table(seen["open"])
    a = rd.find_column(rows[0], m["a"]) if rows else None
    b = rd.find_column(rows[0], m["b"]) if rows else None
    if rows is None or a is None or b is None:
        return FAIL
    la, lb, op, col = rd.column_letter(a), rd.column_letter(b), OPERATORS[m["op"]], m["col"]
    steps = [("header", rd.call("sheet_set", cell=f"{col}1", value=m["header"]))]
    for r, row in enumerate(rows[1:], start=2):
        if max(a, b) < len(row) and row[a].strip() and row[b].strip():
            steps.append((f"row{r}", rd.call("sheet_set", cell=f"{col}{r}", value=f"={la}{r}{op}{lb}{r}")))
    steps.append(("save", rd.call("sheet_save")))
    return first(seen, *steps) or finish(seen, "save")


def finish(seen: Seen, last: str) -> Step:
    """DONE when the last step worked."""
    return FAIL if rd.failed(seen.get(last)) else DONE


# -- editor -------------------------------------------------------------------------------------------------------


def edit_file(path: str, seen: Seen, edits_of: Callable[[str], list[rd.Edit] | None]) -> Step:
    """Open ``path``, make the edits computed from its text, read the buffer back, save if it reads as expected."""
    if s := first(seen, ("open", f"editor_open: {path}")):
        return s
    text = rd.document(seen["open"])
    edits = edits_of(text) if text is not None else None
    if not edits:
        return FAIL
    steps = [(f"edit{k}", e.action) for k, e in enumerate(edits)] + [("reread", f"editor_open: {path}")]
    if s := first(seen, *steps):
        return s
    if rd.document(seen["reread"]) != edits[-1].after:
        return FAIL
    return first(seen, ("save", rd.call("editor_save"))) or finish(seen, "save")


_CHANGE = re.compile(r'(?:set|change) "(?P<key>[^"]+)" to (?P<value>"[^"]*"|[\w.+-]+)'
                     r'|turn the "(?P<feature>[^"]+)" feature (?P<onoff>on|off)')


def json_config(m: dict[str, str], seen: Seen) -> Step:
    changes = []
    for c in _CHANGE.finditer(m["changes"]):
        if c.group("feature"):
            changes.append((c.group("feature"), c.group("onoff") == "on", "feature"))
        else:
            try:
                value = json.loads(c.group("value"))
            except ValueError:
                value = c.group("value")
            changes.append((c.group("key"), value, None))

    def edits(text: str) -> list[rd.Edit] | None:
        out: list[rd.Edit] = []
        for key, value, hint in changes:
            e = rd.json_value_edit(out[-1].after if out else text, key, value, hint)
            if e is None:
                return None
            out.append(e)
        try:
            json.loads(out[-1].after if out else "")
        except ValueError:
            return None
        return out

    return edit_file(m["path"], seen, edits) if changes else FAIL


def ini_setting(m: dict[str, str], seen: Seen) -> Step:
    def edits(text: str) -> list[rd.Edit] | None:
        e = rd.ini_value_edit(text, m["section"], m["key"], m["value"])
        return [e] if e else None
    return edit_file(m["path"], seen, edits)


def text_edit(m: dict[str, str], seen: Seen) -> Step:
    what = m["what"]

    def edits(text: str) -> list[rd.Edit] | None:
        if r := re.fullmatch(r'replace every occurrence of "([^"]+)" with "([^"]*)"', what):
            old, new = r.groups()
            return [rd.Edit(rd.call("editor_replace", find=old, replace=new), text.replace(old, new))] \
                if old in text else None
        if r := re.fullmatch(r'delete the line "([^"]+)"', what):
            return rd.delete_line_edits(text, r.group(1)) or None
        if r := re.fullmatch(r'insert the (?:title )?line "([^"]*)"( followed by an empty line)? at the (?:very )?top',
                             what):
            block = "\n".join([r.group(1)] + ([""] if r.group(2) else []))
            return [rd.Edit(rd.call("editor_insert", line=1, text=block), block + "\n" + text)]
        return None
    return edit_file(m["path"], seen, edits)


# -- terminal -----------------------------------------------------------------------------------------------------


def organize_files(m: dict[str, str], seen: Seen) -> Step:
    where = m["dir"].rstrip("/")
    moves = [(ext, folder.rstrip("/")) for ext, folder in
             re.findall(r"every \.(\w+) file into (?:a new folder |the folder )?(\S+?)(?= and |$)", m["moves"])]
    if not moves:
        return FAIL
    if s := first(seen, ("list", f"terminal: ls -Ap {rd.shell_path(where)}")):
        return s
    names = rd.listing(seen["list"])
    if names is None:
        return FAIL
    files = [n for n in names if not n.endswith("/")]
    plan_ = {folder: [n for n in files if n.lower().endswith("." + ext.lower())] for ext, folder in moves}
    rel = {f: f[len(where) + 1:] if f.startswith(where + "/") else f for f in plan_}
    parts = [f"cd {rd.shell_path(where)}", "mkdir -p " + " ".join(rd.shell_path(rel[f]) for f in plan_)]
    parts += [f"mv -- {' '.join(shlex.quote(n) for n in names_)} {rd.shell_path(rel[f])}/"
              for f, names_ in plan_.items() if names_]
    if s := first(seen, ("move", "terminal: " + " && ".join(parts)),
                  ("check", f"terminal: cd {rd.shell_path(where)} && find . -type f | sort")):
        return s
    found = set(rd.listing(seen["check"]) or [])
    moved = {n for names_ in plan_.values() for n in names_}
    want = {f"./{rel[f]}/{n}" for f, names_ in plan_.items() for n in names_} | {f"./{n}" for n in files
                                                                               if n not in moved}
    return DONE if want <= found else FAIL


def project_tests(m: dict[str, str], seen: Seen) -> Step:
    cwd, project, package = m["cwd"], m["dir"].rstrip("/"), m["package"]
    run = rd.call("terminal", command=f"cd {rd.shell_path(cwd)} && {m['command']} 2>&1", timeout_s=120.0)
    if s := first(seen, ("run", run)):
        return s
    if rp.passed(seen["run"]):
        return DONE  # nothing fails: nothing to fix, and the run is in the terminal
    fails = rp.failures(seen["run"])
    if not fails:
        return FAIL
    test_files = sorted({"/".join(f.test_id.split(".")[:-2]) + ".py" for f in fails})
    listing = f"terminal: cd {rd.shell_path(project)} && grep -rn --include='*.py' '' {shlex.quote(package)} " \
              + " ".join(shlex.quote(t) for t in test_files)
    if s := first(seen, ("read", listing)):
        return s
    files = rp.sources(seen["read"])
    pkg = {p: lines for p, lines in files.items() if p.startswith(package + "/")}
    cands = rp.candidates(pkg, rp.suspects(fails, {p: v for p, v in files.items() if p not in pkg}, pkg))
    if not cands:
        return FAIL
    trial = rp.trial_command(rd.shell_path(project), [f.test_id for f in fails], cands, 80.0)
    if s := first(seen, ("trial", rd.call("terminal", command=trial, timeout_s=110.0))):
        return s
    k = rp.chosen(seen["trial"])
    if k is None:
        return FAIL
    fix = cands[k]

    def edits(text: str) -> list[rd.Edit] | None:  # the line must still read as the trial saw it
        if text.split("\n")[fix.line - 1:fix.line] != [fix.old]:
            return None
        return [rd.replace_line(text, fix.line - 1, fix.new)]

    step = edit_file(f"{project}/{fix.path}", seen, edits)
    if step != DONE:
        return step
    return first(seen, ("final", run)) or (DONE if rp.passed(seen["final"]) else FAIL)


FIELD_ROLES = [("ip", "ip"), ("service", "service"), ("level", "level"), ("method", "method"), ("path", "path"),
               ("status", "status"), ("bytes", "bytes"), ("size", "bytes"), ("time", "time")]


def log_query(m: dict[str, str], seen: Seen) -> Step:
    fields = [f.strip().lower() for f in m["fields"].split(",")]
    col = {}
    for i, name in enumerate(fields, start=1):
        for word, role in FIELD_ROLES:
            if word in name and role not in col:
                col[role] = i
                break
    q, path = m["question"], rd.shell_path(m["log"])
    conds = []
    if r := re.search(r"\b(ERROR|WARN|WARNING|INFO|DEBUG)\b", q):
        conds.append(f'${col["level"]} == "{r.group(1)}"')
    if r := re.search(r"\[(\w[\w-]*)\]", q):
        conds.append(f'${col["service"]} == "[{r.group(1)}]"')
    if r := re.search(r"\bstatus (\d{3})\b", q):
        conds.append(f'${col["status"]} == {r.group(1)}')
    if r := re.search(r"\b(GET|POST|PUT|DELETE|PATCH|HEAD)\b", q):
        conds.append(f'${col["method"]} == "{r.group(1)}"')
    if r := re.search(r"(?<![\w\]])(/[\w./-]*\w)", q):
        conds.append(f'${col["path"]} == "{r.group(1)}"')
    cond = " && ".join(conds) or "1"
    subject = re.sub(r"\(.*?\)", "", q.split(" over ")[0] if " sum " in q else q).lower()
    role = next((role for word, role in FIELD_ROLES if re.search(rf"\b{word}\b", subject)), None)
    if q.startswith("How many distinct") and role:
        command, top = f"awk '{cond} {{print ${col[role]}}}' {path} | sort -u | wc -l", False
    elif q.startswith("How many"):
        command, top = f"awk '{cond} {{n++}} END {{print n+0}}' {path}", False
    elif q.startswith("Which") and "most" in q and role:
        command, top = f"awk '{cond} {{print ${col[role]}}}' {path} | sort | uniq -c | sort -rn | head -n 3", True
    elif "sum of" in q and ("last field" in q or role):
        field = "$NF" if "last field" in q else f"${col[role]}"
        command, top = f"awk '{cond} {{s += {field}}} END {{printf \"%.0f\\n\", s}}' {path}", False
    else:
        return FAIL
    query = rd.call("terminal", command=command, timeout_s=120.0)
    if s := first(seen, ("peek", f"terminal: head -n 3 {path}"), ("query", query)):
        return s
    peek = [] if rd.failed(seen["peek"]) else seen["peek"].splitlines()
    if not peek or any(len(line.split()) != len(fields) for line in peek):
        return FAIL  # the log is not laid out as the instruction says
    out = seen["query"]
    answer = (out.split()[1] if not rd.failed(out) and len(out.split()) > 1 else None) if top else rd.last_int(out)
    if answer is None:
        return FAIL
    target = rd.shell_path(m["answer"])
    if s := first(seen, ("write", f"terminal: printf '%s\\n' {shlex.quote(answer)} > {target}"),
                  ("check", f"terminal: cat {target}")):
        return s
    return DONE if seen["check"].strip() == answer else FAIL


# -- what the desktop cannot do -------------------------------------------------------------------------------------

NEEDS = [  # what an instruction may ask for -> the programs that provide it on a Linux desktop
    (r"\bLibreOffice\b|\bImpress\b|\bslide deck\b", ["libreoffice", "soffice", "localc", "loimpress"]),
    (r"\bThunderbird\b|\be-?mail\b|\bsend\b.*@", ["thunderbird", "evolution", "mutt", "mail", "sendmail"]),
    (r"\bPhotoshop\b", ["photoshop"]),
    (r"\bGIMP\b|\bcrop\b", ["gimp", "convert", "magick"]),
    (r"\bprint(?:er)?\b", ["lp", "lpr", "lpstat"]),
    (r"\bWi-?Fi\b|\bwireless\b", ["nmcli", "iwctl", "wpa_cli", "iwconfig"]),
    (r"\bBluetooth\b", ["bluetoothctl", "blueman-manager"]),
    (r"\brefresh rate\b|\bdisplay settings\b|\bresolution\b", ["xrandr", "gnome-control-center", "wlr-randr"]),
    (r"\bvideo call\b|\bshare the screen\b", ["zoom", "teams", "skype", "firefox", "chromium", "google-chrome"]),
]
FILE_NEEDS = [(r"\bcalendar invitation\b", "*.ics")]  # what it names -> the files that would hold it


def probe(text: str, seen: Seen) -> Step:
    """An instruction without a plan: check whether the desktop has what it needs; FAIL when it does not."""
    programs = [names for pattern, names in NEEDS if re.search(pattern, text, re.IGNORECASE)]
    files = [glob for pattern, glob in FILE_NEEDS if re.search(pattern, text, re.IGNORECASE)]
    if not programs and not files:
        return DONE  # nothing read says it cannot be done
    words = sorted({n for names in programs for n in names})
    checks = [f'for p in {" ".join(words)}; do command -v "$p" >/dev/null && echo "found: $p" '
              f'|| echo "missing: $p"; done'] if words else []
    checks += [f"echo \"files {g}: $(find ~ -name {shlex.quote(g)} 2>/dev/null | wc -l)\"" for g in files]
    if s := first(seen, ("probe", "terminal: " + "; ".join(checks))):
        return s
    out = seen["probe"]
    found = set(re.findall(r"^found: (\S+)$", out, re.MULTILINE))
    missing = set(re.findall(r"^missing: (\S+)$", out, re.MULTILINE))
    lacking = [names for names in programs if not found & set(names) and set(names) <= missing]
    lacking += [g for g in files if re.search(rf"^files {re.escape(g)}: 0$", out, re.MULTILINE)]
    return FAIL if lacking else DONE


_P = r"(?P<{}>~?/\S+?)"
PLANS: list[tuple[re.Pattern[str], Callable[[dict[str, str], Seen], Step]]] = [
    (re.compile(r"In the spreadsheet " + _P.format("src") + r"(?: \(already open\))?, add a row below the data "
                r'with "(?P<label>[^"]+)" in column (?P<label_col>[A-Z]+) and the (?P<what>\w+) of the (?P<column>\w+) '
                r"column in column (?P<value_col>[A-Z]+), computed by a formula\. Save the sheet as CSV to "
                + _P.format("dst") + r"\.?$"), sheet_total),
    (re.compile(r"Open " + _P.format("path") + r" in the spreadsheet\. Add a column (?P<col>[A-Z]+) with the header "
                r'"(?P<header>[^"]+)" holding (?P<a>\w+) (?P<op>times|plus|minus|divided by) (?P<b>\w+) for every'),
     sheet_formula),
    (re.compile(r"In the configuration file " + _P.format("path") + r", (?P<changes>.+?)\. Keep the file valid JSON"),
     json_config),
    (re.compile(r"In " + _P.format("path") + r', set "(?P<key>[^"]+)" in the \[(?P<section>[^\]]+)\] section to '
                r"(?P<value>.+?) and save the file"), ini_setting),
    (re.compile(r"Open the (?:letter|file|document) " + _P.format("path") + r" in the text editor, (?P<what>.+), "
                r"and save it\.?$"), text_edit),
    (re.compile(r"Tidy up " + _P.format("dir") + r": (?P<moves>.+?)\. Leave all other files"), organize_files),
    (re.compile(r"tests of the Python project in " + _P.format("dir") + r" fail\. .*package `(?P<package>[\w.]+)`.*"
                r"\((?P<command>python3 -m unittest), from " + _P.format("cwd") + r"\)"), project_tests),
    (re.compile(r"log is " + _P.format("log") + r" \(fields: (?P<fields>[^)]+)\)\. (?P<question>.+?\?) Write just "
                r"the answer into " + _P.format("answer") + r"\.?$"), log_query),
]

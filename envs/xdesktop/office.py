"""Office files without an office library: the smallest .xlsx and .docx a task ships, and their contents read back.

Owns: ``write_xlsx`` (one sheet of numbers and text) and ``write_docx`` (paragraphs of text), byte-for-byte the same
for the same content (fixed zip times: a generated task file never changes by being regenerated), and the readers
our fallback judges use where OSWorld's own (openpyxl, pandas, python-docx: the ``osworld`` extra) are absent:
``read_xlsx`` (the first sheet's cell values as LibreOffice saved them: cached formula results, shared and inline
strings) and ``read_docx`` (the body's paragraphs' text, as python-docx's ``Document.paragraphs`` gives it).
Why by hand: the two formats' needed subset is a few XML parts; a dependency for it would only be needed without
the extra, where the point is to need nothing.
Must never: read more than ``MAX_PART`` bytes of any part (a file the agent wrote is an adversary's zip).
"""

from __future__ import annotations

import io
import re
import zipfile
from xml.etree import ElementTree
from xml.sax.saxutils import escape

from ..errors import EnvsError

MAX_PART = 64 << 20
_TIME = (2024, 1, 1, 0, 0, 0)
_S = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"
_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
_R = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}"

Cell = str | int | float | None


class OfficeFileError(EnvsError, ValueError):
    """The file is not an office file of the kind read (not a zip, a part missing, a part too large)."""


def _zip(parts: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in parts.items():
            info = zipfile.ZipInfo(name, date_time=_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, text)
    return buf.getvalue()


def _column(index: int) -> str:
    name = ""
    index += 1
    while index:
        index, rem = divmod(index - 1, 26)
        name = chr(65 + rem) + name
    return name


def write_xlsx(rows: list[list[Cell]], sheet: str = "Sheet1") -> bytes:
    """A workbook of one sheet: ``rows`` of numbers (stored as numbers) and text (inline strings); None is empty."""
    lines = []
    for r, row in enumerate(rows, start=1):
        cells = []
        for c, value in enumerate(row):
            ref = f"{_column(c)}{r}"
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                cells.append(f'<c r="{ref}" t="inlineStr"><is><t>{escape(str(value))}</t></is></c>')
            else:
                cells.append(f'<c r="{ref}"><v>{value!r}</v></c>')
        lines.append(f'<row r="{r}">{"".join(cells)}</row>')
    ct = "application/vnd.openxmlformats-officedocument"
    return _zip({
        "[Content_Types].xml": (
            '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
            '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
            '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
            '<Default Extension="xml" ContentType="application/xml"/>'
            f'<Override PartName="/xl/workbook.xml" ContentType="{ct}.spreadsheetml.sheet.main+xml"/>'
            f'<Override PartName="/xl/worksheets/sheet1.xml" ContentType="{ct}.spreadsheetml.worksheet+xml"/>'
            '</Types>'),
        "_rels/.rels": (
            '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
            '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
            '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/'
            'officeDocument" Target="xl/workbook.xml"/></Relationships>'),
        "xl/workbook.xml": (
            '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
            '<workbook xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main" '
            'xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships">'
            f'<sheets><sheet name="{escape(sheet)}" sheetId="1" r:id="rId1"/></sheets></workbook>'),
        "xl/_rels/workbook.xml.rels": (
            '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
            '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
            '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/'
            'worksheet" Target="worksheets/sheet1.xml"/></Relationships>'),
        "xl/worksheets/sheet1.xml": (
            '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
            '<worksheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main">'
            f'<sheetData>{"".join(lines)}</sheetData></worksheet>'),
    })


def write_docx(paragraphs: list[str]) -> bytes:
    """A document of plain paragraphs."""
    body = "".join(f'<w:p><w:r><w:t xml:space="preserve">{escape(p)}</w:t></w:r></w:p>' if p else "<w:p/>"
                   for p in paragraphs)
    return _zip({
        "[Content_Types].xml": (
            '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
            '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
            '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
            '<Default Extension="xml" ContentType="application/xml"/>'
            '<Override PartName="/word/document.xml" ContentType="application/vnd.openxmlformats-officedocument.'
            'wordprocessingml.document.main+xml"/></Types>'),
        "_rels/.rels": (
            '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
            '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
            '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/'
            'officeDocument" Target="word/document.xml"/></Relationships>'),
        "word/document.xml": (
            '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
            '<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main">'
            f'<w:body>{body}</w:body></w:document>'),
    })


def _part(z: zipfile.ZipFile, name: str) -> ElementTree.Element:
    try:
        info = z.getinfo(name)
    except KeyError as exc:
        raise OfficeFileError(f"no part {name}") from exc
    if info.file_size > MAX_PART:
        raise OfficeFileError(f"part {name} is {info.file_size} bytes (at most {MAX_PART})")
    with z.open(info) as f:
        data = f.read(MAX_PART + 1)
    if len(data) > MAX_PART:
        raise OfficeFileError(f"part {name} is larger than {MAX_PART} bytes")
    try:
        return ElementTree.fromstring(data)
    except ElementTree.ParseError as exc:
        raise OfficeFileError(f"part {name}: {exc}") from exc


def _open(path: str) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise OfficeFileError(f"{path}: not a zip file ({exc})") from exc


def _number(text: str) -> int | float:
    value = float(text)
    return int(value) if value.is_integer() and re.fullmatch(r"-?\d+", text.strip()) else value


def read_xlsx(path: str) -> list[list[Cell]]:
    """The first sheet's rows, each cell's value as saved (a formula's cached result); trailing empties dropped."""
    with _open(path) as z:
        book = _part(z, "xl/workbook.xml")
        sheet = book.find(f"{_S}sheets/{_S}sheet")
        if sheet is None:
            raise OfficeFileError(f"{path}: the workbook has no sheet")
        rels = _part(z, "xl/_rels/workbook.xml.rels")
        rid = sheet.get(f"{_R}id")
        target = next((r.get("Target", "") for r in rels if r.get("Id") == rid), None)
        if not target:
            raise OfficeFileError(f"{path}: the first sheet's part is not named")
        name = target.lstrip("/") if target.startswith("/") else "xl/" + target
        shared: list[str] = []
        if "xl/sharedStrings.xml" in z.namelist():
            shared = ["".join(t.text or "" for t in si.iter(f"{_S}t"))
                      for si in _part(z, "xl/sharedStrings.xml").findall(f"{_S}si")]
        rows: dict[int, dict[int, Cell]] = {}
        for row in _part(z, name).iter(f"{_S}row"):
            for n, cell in enumerate(row.findall(f"{_S}c")):
                ref = cell.get("r") or ""
                m = re.fullmatch(r"([A-Z]+)(\d+)", ref)
                if m:
                    col = 0
                    for ch in m.group(1):
                        col = col * 26 + ord(ch) - 64
                    r, c = int(m.group(2)), col - 1
                else:
                    r, c = int(row.get("r", "0") or 0), n
                rows.setdefault(r, {})[c] = _value(cell, shared)
    if not rows:
        return []
    out: list[list[Cell]] = []
    for r in range(1, max(rows) + 1):
        cells = rows.get(r, {})
        line = [cells.get(c) for c in range(max(cells) + 1)] if cells else []
        while line and line[-1] in (None, ""):
            line.pop()
        out.append(line)
    while out and not out[-1]:
        out.pop()
    return out


def _value(cell: ElementTree.Element, shared: list[str]) -> Cell:
    kind = cell.get("t", "n")
    v = cell.find(f"{_S}v")
    if kind == "inlineStr":
        return "".join(t.text or "" for t in cell.iter(f"{_S}t"))
    if v is None or v.text is None:
        return None
    if kind == "s":
        index = int(v.text)
        return shared[index] if 0 <= index < len(shared) else None
    if kind in ("str", "e"):
        return v.text
    if kind == "b":
        return v.text == "1"
    try:
        return _number(v.text)
    except ValueError:
        return v.text


def read_docx(path: str) -> list[str]:
    """The text of the body's paragraphs (not those inside tables), runs joined, tabs and breaks as characters."""
    with _open(path) as z:
        doc = _part(z, "word/document.xml")
    body = doc.find(f"{_W}body")
    if body is None:
        raise OfficeFileError(f"{path}: the document has no body")
    paragraphs = []
    for p in body.findall(f"{_W}p"):
        parts = []
        for node in p.iter():
            if node.tag == f"{_W}t":
                parts.append(node.text or "")
            elif node.tag == f"{_W}tab":
                parts.append("\t")
            elif node.tag in (f"{_W}br", f"{_W}cr"):
                parts.append("\n")
        paragraphs.append("".join(parts))
    return paragraphs

"""The desktop's accessibility tree in OSWorld's XML: a script the image's python3 runs as the agent (pyatspi).

Owns: walking AT-SPI's registry (every application, depth first, at most MAX_DEPTH deep and MAX_WIDTH wide; in a
LibreOffice Calc table only the cells on screen) and writing each node as OSWorld's Linux server does: the role
as the tag, ``name``, ``st:`` states, ``attr:`` object attributes, ``cp:`` screen position and size of what is
showing, the text as the element's text, ``image``/``selection`` flags, ``val:`` values, ``act:`` actions.
Applications come in the registry's order (OSWorld's come in the order its threads finish).
Runs outside the runtime: standard library and pyatspi only; ``python3 a11y_guest.py OUT`` writes the XML to OUT.
Must never: import anything of bunshin (it runs on the image's interpreter, not the runtime's).
"""

import contextlib
import sys
import xml.etree.ElementTree as ET

NS = {
    "st": "https://accessibility.ubuntu.example.org/ns/state",
    "attr": "https://accessibility.ubuntu.example.org/ns/attributes",
    "cp": "https://accessibility.ubuntu.example.org/ns/component",
    "doc": "https://accessibility.ubuntu.example.org/ns/document",
    "docattr": "https://accessibility.ubuntu.example.org/ns/document/attributes",
    "txt": "https://accessibility.ubuntu.example.org/ns/text",
    "val": "https://accessibility.ubuntu.example.org/ns/value",
    "act": "https://accessibility.ubuntu.example.org/ns/action",
}
MAX_DEPTH = 50
MAX_WIDTH = 1024
CALC_ROWS = 500
CALC_COLUMNS = 500


def q(prefix, name):
    return f"{{{NS[prefix]}}}{name}"


def element(node, depth, in_calc, pyatspi):
    try:
        role = node.getRoleName().strip()
    except Exception:
        role = ""
    tag = role.replace(" ", "-") or "unknown"
    try:
        name = node.name or ""
    except Exception:
        name = ""
    el = ET.Element(tag, {"name": name})
    try:
        states = node.getState().getStates()
    except Exception:
        states = []
    names = set()
    for state in states:
        label = getattr(state, "value_name", str(state))  # ATSPI_STATE_MULTI_LINE (or STATE_...): multi_line
        label = label.split("STATE_", 1)[-1].lower()
        names.add(label)
        el.set(q("st", label), "true")
    try:
        for key, value in node.get_attributes().items():
            if key:
                el.set(q("attr", key), str(value))
    except Exception:
        pass
    if "visible" in names and "showing" in names:
        try:
            component = node.queryComponent()
            x, y, w, h = component.getExtents(pyatspi.XY_SCREEN)
            el.set(q("cp", "screencoord"), f"({x}, {y})")
            el.set(q("cp", "size"), f"({w}, {h})")
        except Exception:
            pass
    try:
        text_iface = node.queryText()
        content = text_iface.getText(0, text_iface.characterCount).replace("\ufffc", "").replace("\ufffd", "")
        if content:
            el.text = content
    except Exception:
        pass
    for iface, attribute in (("queryImage", "image"), ("querySelection", "selection")):
        try:
            getattr(node, iface)()
            el.set(attribute, "true")
        except Exception:
            pass
    try:
        value = node.queryValue()
        for key, read in (("value", "currentValue"), ("min", "minimumValue"), ("max", "maximumValue"),
                          ("step", "minimumIncrement")):
            with contextlib.suppress(Exception):
                el.set(q("val", key), str(getattr(value, read)))
    except Exception:
        pass
    try:
        action = node.queryAction()
        for i in range(action.nActions):
            label = action.getName(i).replace(" ", "-")
            el.set(q("act", label + "_desc"), action.getDescription(i) or "")
            el.set(q("act", label + "_kb"), action.getKeyBinding(i) or "")
    except Exception:
        pass
    in_calc = in_calc or role == "document spreadsheet"
    if depth >= MAX_DEPTH:
        return el
    if in_calc and role == "table":
        for child in calc_cells(node):
            el.append(element(child, depth + 1, True, pyatspi))
        return el
    try:
        count = min(node.childCount, MAX_WIDTH)
    except Exception:
        count = 0
    for i in range(count):
        try:
            child = node.getChildAtIndex(i)
        except Exception:
            break
        if child is not None:
            el.append(element(child, depth + 1, in_calc, pyatspi))
    return el


def calc_cells(table):
    """The cells of a Calc sheet that are on screen (the sheet has millions: only the showing ones are walked)."""
    import pyatspi

    def showing(cell):
        try:
            return cell.getState().contains(pyatspi.STATE_SHOWING)
        except Exception:
            return False

    try:
        columns = table.queryTable().nColumns
        rows = table.queryTable().nRows
    except Exception:
        return []
    cells, table_iface = [], table.queryTable()
    for row in range(min(rows, CALC_ROWS)):
        row_cells, seen = [], False
        for column in range(min(columns, CALC_COLUMNS)):
            try:
                cell = table_iface.getAccessibleAt(row, column)
            except Exception:
                break
            if cell is not None and showing(cell):
                seen = True
                row_cells.append(cell)
            elif seen:
                break
        if not row_cells and cells:
            break
        cells.extend(row_cells)
    return cells


def main(out_path):
    import pyatspi

    for prefix, uri in NS.items():
        ET.register_namespace(prefix, uri)
    root = ET.Element("desktop-frame")  # ElementTree declares the prefixes the tree uses on it
    desktop = pyatspi.Registry.getDesktop(0)
    for i in range(min(desktop.childCount, MAX_WIDTH)):
        try:
            app = desktop.getChildAtIndex(i)
        except Exception:
            continue
        if app is not None:
            root.append(element(app, 1, False, pyatspi))
    with open(out_path, "w", encoding="utf-8") as out:
        out.write(ET.tostring(root, encoding="unicode"))


if __name__ == "__main__":
    main(sys.argv[1])

"""Keys as Chromium's ``Input.dispatchKeyEvent`` wants them: names, codes, Windows key codes, modifier bits.

Owns: the US-layout table of the keys an agent presses by name (WebArena's ``press [Control+a]``: Enter,
Backspace, Tab, Escape, arrows, paging, Home/End, Delete, Space, F1-F12, letters and digits), parsing a
combination (``Control+Shift+a``), and the events of one key press or of one typed character.
Must never: send an event for a key it does not know: that is a ``KeyError`` naming it.
"""

from __future__ import annotations

from typing import Any

MODIFIERS = {"Alt": 1, "Control": 2, "Meta": 4, "Shift": 8}
_ALIASES = {"ctrl": "Control", "control": "Control", "alt": "Alt", "shift": "Shift", "meta": "Meta", "cmd": "Meta",
            "enter": "Enter", "return": "Enter", "backspace": "Backspace", "tab": "Tab", "escape": "Escape",
            "esc": "Escape", "delete": "Delete", "del": "Delete", "space": " ", "home": "Home", "end": "End",
            "pageup": "PageUp", "pagedown": "PageDown", "arrowup": "ArrowUp", "arrowdown": "ArrowDown",
            "arrowleft": "ArrowLeft", "arrowright": "ArrowRight", "up": "ArrowUp", "down": "ArrowDown",
            "left": "ArrowLeft", "right": "ArrowRight", "insert": "Insert"}
# key -> (code, Windows virtual key code, the text it types or "")
_SPECIAL: dict[str, tuple[str, int, str]] = {
    "Enter": ("Enter", 13, "\r"), "Backspace": ("Backspace", 8, ""), "Tab": ("Tab", 9, ""),
    "Escape": ("Escape", 27, ""), "Delete": ("Delete", 46, ""), " ": ("Space", 32, " "), "Home": ("Home", 36, ""),
    "End": ("End", 35, ""), "PageUp": ("PageUp", 33, ""), "PageDown": ("PageDown", 34, ""),
    "ArrowUp": ("ArrowUp", 38, ""), "ArrowDown": ("ArrowDown", 40, ""), "ArrowLeft": ("ArrowLeft", 37, ""),
    "ArrowRight": ("ArrowRight", 39, ""), "Insert": ("Insert", 45, ""),
    "Alt": ("AltLeft", 18, ""), "Control": ("ControlLeft", 17, ""), "Meta": ("MetaLeft", 91, ""),
    "Shift": ("ShiftLeft", 16, ""),
    **{f"F{n}": (f"F{n}", 111 + n, "") for n in range(1, 13)},
}
_EDIT_COMMANDS = {("a", 2): "selectAll", ("c", 2): "copy", ("x", 2): "cut", ("v", 2): "paste", ("z", 2): "undo"}


def canonical(name: str) -> str:
    """A key name as the table spells it (``ctrl`` -> Control, ``a`` stays a); ``KeyError`` if unknown."""
    if len(name) == 1:
        return name
    key = _ALIASES.get(name.lower(), name)
    if key not in _SPECIAL:
        raise KeyError(f"unknown key {name!r}")
    return key


def parse_combination(text: str) -> tuple[str, int]:
    """``Control+Shift+a`` -> ("a", Control|Shift); the last part is the key, the others must be modifiers."""
    parts = [p for p in text.split("+") if p] if text != "+" else ["+"]
    if not parts:
        raise KeyError(f"no key in {text!r}")
    *mods, last = [canonical(p.strip() or p) for p in parts]
    bits = 0
    for mod in mods:
        if mod not in MODIFIERS:
            raise KeyError(f"{mod!r} is not a modifier (Alt, Control, Meta, Shift) in {text!r}")
        bits |= MODIFIERS[mod]
    return last, bits


def _describe(key: str) -> tuple[str, int, str]:
    if key in _SPECIAL:
        return _SPECIAL[key]
    if len(key) == 1 and key.isascii() and key.isalnum():
        upper = key.upper()
        return (f"Key{upper}" if key.isalpha() else f"Digit{key}", ord(upper), key)
    return ("", 0, key)


def key_events(key: str, modifiers: int = 0) -> list[dict[str, Any]]:
    """The keyDown (typing its character when it has one and no Control/Alt/Meta is held) and keyUp of ``key``."""
    code, vk, text = _describe(key)
    if modifiers & MODIFIERS["Shift"] and len(text) == 1:
        text = text.upper()
    down: dict[str, Any] = {"type": "keyDown" if text and not modifiers & 7 else "rawKeyDown", "key": key,
                            "code": code, "windowsVirtualKeyCode": vk, "modifiers": modifiers}
    if text and not modifiers & 7:
        down["text"] = down["unmodifiedText"] = text
    command = _EDIT_COMMANDS.get((key.lower(), modifiers))
    if command:
        down["commands"] = [command]
    up = {"type": "keyUp", "key": key, "code": code, "windowsVirtualKeyCode": vk, "modifiers": modifiers}
    return [down, up]


def char_events(ch: str) -> list[dict[str, Any]]:
    """Typing the character ``ch`` (a newline presses Enter)."""
    if ch == "\n":
        return key_events("Enter")
    return key_events(ch)

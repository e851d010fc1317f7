"""The desktop user's home directory as every task starts from it: documents, CSV sheets, JSON/INI configs and a
small Python project (``~/project``, package ``calc`` with a ``unittest`` suite whose stress tests do ~1.5 s of real
work). Deterministic: the same files, byte for byte, in every workspace.

Owns: ``base_files()`` (relative path under the home -> text) and the project's sources (the project-tests
template breaks one function of it per task).
"""

from __future__ import annotations

OPS = '''"""Arithmetic helpers."""


def add(a, b):
    return a + b


def sub(a, b):
    return a - b


def mul(a, b):
    return a * b


def clamp(x, lo, hi):
    return max(lo, min(x, hi))


def is_even(n):
    return n % 2 == 0
'''

STATS = '''"""Statistics over lists of numbers."""

from . import ops


def total(xs):
    s = 0
    for x in xs:
        s = ops.add(s, x)
    return s


def mean(xs):
    return total(xs) / len(xs)


def median(xs):
    ys = sorted(xs)
    n = len(ys)
    mid = n // 2
    if n % 2 == 1:
        return ys[mid]
    return (ys[mid - 1] + ys[mid]) / 2


def count_even(xs):
    return sum(1 for x in xs if ops.is_even(x))
'''

TEST_OPS = '''import unittest

from calc import ops


class TestOps(unittest.TestCase):
    def test_add_sub_mul(self):
        self.assertEqual(ops.add(2, 3), 5)
        self.assertEqual(ops.sub(10, 4), 6)
        self.assertEqual(ops.mul(6, 7), 42)

    def test_clamp(self):
        self.assertEqual(ops.clamp(5, 0, 3), 3)
        self.assertEqual(ops.clamp(-2, 0, 3), 0)
        self.assertEqual(ops.clamp(2, 0, 3), 2)

    def test_stress_add_mul(self):
        acc = 0
        for i in range(3000000):
            acc = ops.add(acc, ops.mul(i, 3))
        self.assertEqual(acc, 3 * 2999999 * 3000000 // 2)

    def test_stress_even(self):
        self.assertEqual(sum(1 for i in range(3000000) if ops.is_even(i)), 1500000)
'''

TEST_STATS = '''import unittest

from calc import stats


class TestStats(unittest.TestCase):
    def test_mean_median(self):
        self.assertEqual(stats.mean([1, 2, 3, 4]), 2.5)
        self.assertEqual(stats.median([5, 1, 3]), 3)
        self.assertEqual(stats.median([4, 1, 3, 2]), 2.5)

    def test_stress_total(self):
        xs = list(range(4000000))
        self.assertEqual(stats.total(xs), 3999999 * 4000000 // 2)
        self.assertEqual(stats.count_even(xs), 2000000)
'''

README = """# calc

A tiny arithmetic and statistics package.

Run the tests from this directory:

    python3 -m unittest
"""

MEETING = """Weekly sync - notes

Attendees: Ana, Bruno, Chen, Dara
- The release is planned for Friday.
- Bruno will update the install guide.
- Chen reported two flaky tests in the nightly build.
- Next meeting: Tuesday 10:00.
"""

BUDGET = """item,q1,q2,q3,q4
rent,3000,3000,3000,3000
salaries,21000,21500,22000,22400
software,1200,900,1500,1100
travel,800,1450,600,2100
"""

CONTACTS = """name,email,city
Ana Lima,ana@example.org,Lisbon
Bruno Costa,bruno@example.org,Porto
Chen Wei,chen@example.org,Shanghai
Dara Okafor,dara@example.org,Lagos
"""

SETTINGS = """{
  "theme": "light",
  "font_size": 12,
  "autosave": true,
  "recent_files": ["Documents/meeting_notes.txt", "Documents/budget.csv"]
}
"""

APP_INI = """[general]
name = desktop
language = en

[display]
scale = 1.0
"""


def base_files() -> dict[str, str]:
    return {
        "Documents/meeting_notes.txt": MEETING,
        "Documents/budget.csv": BUDGET,
        "Documents/contacts.csv": CONTACTS,
        "config/settings.json": SETTINGS,
        "config/app.ini": APP_INI,
        "project/README.md": README,
        "project/calc/__init__.py": "",
        "project/calc/ops.py": OPS,
        "project/calc/stats.py": STATS,
        "project/tests/__init__.py": "",
        "project/tests/test_ops.py": TEST_OPS,
        "project/tests/test_stats.py": TEST_STATS,
    }

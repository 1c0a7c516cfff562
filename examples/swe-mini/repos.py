"""The ten swe-mini repositories, written for lodestar: each a small module with one bug, a visible test that
passes and must keep passing (PASS_TO_PASS), and a hidden test (in the task's test patch) that fails until
the bug is fixed (FAIL_TO_PASS). Pure standard library; the tests need only pytest.

`make_tasks.py` turns these into git bundles and `tasks.jsonl`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MiniRepo:
    name: str
    """Repository and package name; the module is `<name>/__init__.py`."""
    prompt: str
    """The issue, as a user would file it."""
    buggy: str
    """The module at the base commit."""
    fixed: str
    """The module after the reference fix (the gold patch)."""
    visible_test: str
    """`tests/test_<name>.py` at the base commit: the PASS_TO_PASS test(s)."""
    hidden_test: str
    """Appended to the test file by the test patch: the FAIL_TO_PASS test."""
    passing: str
    """Name of the visible test function."""
    failing: str
    """Name of the hidden test function."""


REPOS = [
    MiniRepo(
        name="slugify",
        prompt="slugify() leaves repeated dashes and leading/trailing dashes in the slug: "
        "slugify('  Hello,  World! ') should be 'hello-world'.",
        buggy='''"""URL slugs."""

import re


def slugify(text: str) -> str:
    """Lower-case `text`, and replace every run of characters that are not letters or digits by one dash."""
    return re.sub(r"[^a-z0-9]", "-", text.lower())
''',
        fixed='''"""URL slugs."""

import re


def slugify(text: str) -> str:
    """Lower-case `text`, and replace every run of characters that are not letters or digits by one dash."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
''',
        visible_test="""from slugify import slugify


def test_simple_word():
    assert slugify("Hello") == "hello"
""",
        hidden_test="""

def test_collapses_and_strips_dashes():
    assert slugify("  Hello,  World! ") == "hello-world"
""",
        passing="test_simple_word",
        failing="test_collapses_and_strips_dashes",
    ),
    MiniRepo(
        name="roman",
        prompt="to_roman(4) returns 'IIII' and to_roman(9) returns 'VIIII'; they should be 'IV' and 'IX' "
        "(and likewise 40 -> 'XL', 90 -> 'XC', 400 -> 'CD', 900 -> 'CM').",
        buggy='''"""Roman numerals."""

NUMERALS = [(1000, "M"), (500, "D"), (100, "C"), (50, "L"), (10, "X"), (5, "V"), (1, "I")]


def to_roman(number: int) -> str:
    """`number` (1..3999) as a Roman numeral."""
    out = []
    for value, letters in NUMERALS:
        while number >= value:
            out.append(letters)
            number -= value
    return "".join(out)
''',
        fixed='''"""Roman numerals."""

NUMERALS = [
    (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
    (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
]


def to_roman(number: int) -> str:
    """`number` (1..3999) as a Roman numeral."""
    out = []
    for value, letters in NUMERALS:
        while number >= value:
            out.append(letters)
            number -= value
    return "".join(out)
''',
        visible_test="""from roman import to_roman


def test_additive_numerals():
    assert [to_roman(n) for n in (1, 3, 6, 15, 2023)] == ["I", "III", "VI", "XV", "MMXXIII"]
""",
        hidden_test="""

def test_subtractive_numerals():
    assert [to_roman(n) for n in (4, 9, 14, 40, 90, 400, 1994)] == ["IV", "IX", "XIV", "XL", "XC", "CD", "MCMXCIV"]
""",
        passing="test_additive_numerals",
        failing="test_subtractive_numerals",
    ),
    MiniRepo(
        name="chunks",
        prompt="chunked([1, 2, 3, 4, 5], 2) drops the last, shorter chunk: it returns [[1, 2], [3, 4]] "
        "instead of [[1, 2], [3, 4], [5]].",
        buggy='''"""Split sequences into chunks."""


def chunked(items: list, size: int) -> list:
    """`items` in consecutive chunks of `size` (the last one may be shorter)."""
    return [items[start : start + size] for start in range(0, len(items) - size + 1, size)]
''',
        fixed='''"""Split sequences into chunks."""


def chunked(items: list, size: int) -> list:
    """`items` in consecutive chunks of `size` (the last one may be shorter)."""
    return [items[start : start + size] for start in range(0, len(items), size)]
''',
        visible_test="""from chunks import chunked


def test_even_split():
    assert chunked([1, 2, 3, 4], 2) == [[1, 2], [3, 4]]
""",
        hidden_test="""

def test_keeps_the_remainder():
    assert chunked([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
""",
        passing="test_even_split",
        failing="test_keeps_the_remainder",
    ),
    MiniRepo(
        name="stats",
        prompt="median([1, 2, 3, 4]) returns 3; the median of an even number of values is the mean of the two "
        "middle ones (2.5).",
        buggy='''"""Small statistics helpers."""


def median(values: list) -> float:
    """The median of a non-empty list of numbers."""
    ordered = sorted(values)
    return ordered[len(ordered) // 2]
''',
        fixed='''"""Small statistics helpers."""


def median(values: list) -> float:
    """The median of a non-empty list of numbers."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2
''',
        visible_test="""from stats import median


def test_odd_length():
    assert median([3, 1, 2]) == 2
""",
        hidden_test="""

def test_even_length():
    assert median([4, 1, 3, 2]) == 2.5
""",
        passing="test_odd_length",
        failing="test_even_length",
    ),
    MiniRepo(
        name="wordfreq",
        prompt="word_counts('The cat and the hat') counts 'The' and 'the' as different words; counting should "
        "ignore case (the: 2).",
        buggy='''"""Word frequencies."""

from collections import Counter


def word_counts(text: str) -> dict:
    """How often each word occurs in `text` (words are runs of letters)."""
    words = [word for word in "".join(c if c.isalpha() else " " for c in text).split()]
    return dict(Counter(words))
''',
        fixed='''"""Word frequencies."""

from collections import Counter


def word_counts(text: str) -> dict:
    """How often each word occurs in `text` (words are runs of letters)."""
    words = [word.lower() for word in "".join(c if c.isalpha() else " " for c in text).split()]
    return dict(Counter(words))
''',
        visible_test="""from wordfreq import word_counts


def test_counts_words():
    assert word_counts("a b a, c!") == {"a": 2, "b": 1, "c": 1}
""",
        hidden_test="""

def test_ignores_case():
    assert word_counts("The cat and the hat")["the"] == 2
""",
        passing="test_counts_words",
        failing="test_ignores_case",
    ),
    MiniRepo(
        name="intervals",
        prompt="merge([(5, 8), (1, 3), (2, 4)]) returns [(5, 8), (1, 4)]; merged intervals should come back sorted "
        "by start: [(1, 4), (5, 8)], also when the input is not sorted.",
        buggy='''"""Interval arithmetic."""


def merge(intervals: list) -> list:
    """Merge overlapping closed intervals (start, end); the result is sorted by start."""
    merged: list = []
    for start, end in intervals:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
''',
        fixed='''"""Interval arithmetic."""


def merge(intervals: list) -> list:
    """Merge overlapping closed intervals (start, end); the result is sorted by start."""
    merged: list = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
''',
        visible_test="""from intervals import merge


def test_sorted_input():
    assert merge([(1, 3), (2, 4), (6, 7)]) == [(1, 4), (6, 7)]
""",
        hidden_test="""

def test_unsorted_input():
    assert merge([(5, 8), (1, 3), (2, 4)]) == [(1, 4), (5, 8)]
""",
        passing="test_sorted_input",
        failing="test_unsorted_input",
    ),
    MiniRepo(
        name="duration",
        prompt="parse_duration('1m30s') raises ValueError; seconds ('s') should be accepted like hours and "
        "minutes: '1m30s' is 90 seconds.",
        buggy='''"""Durations such as "1h30m"."""

import re

UNITS = {"h": 3600, "m": 60}


def parse_duration(text: str) -> int:
    """Seconds in a duration such as "2h", "1h30m" or "45s"."""
    parts = re.findall(r"(\\d+)([a-z])", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r}")
    total = 0
    for number, unit in parts:
        if unit not in UNITS:
            raise ValueError(f"unknown unit {unit!r}")
        total += int(number) * UNITS[unit]
    return total
''',
        fixed='''"""Durations such as "1h30m"."""

import re

UNITS = {"h": 3600, "m": 60, "s": 1}


def parse_duration(text: str) -> int:
    """Seconds in a duration such as "2h", "1h30m" or "45s"."""
    parts = re.findall(r"(\\d+)([a-z])", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r}")
    total = 0
    for number, unit in parts:
        if unit not in UNITS:
            raise ValueError(f"unknown unit {unit!r}")
        total += int(number) * UNITS[unit]
    return total
''',
        visible_test="""from duration import parse_duration


def test_hours_and_minutes():
    assert parse_duration("1h30m") == 5400
""",
        hidden_test="""

def test_seconds():
    assert parse_duration("1m30s") == 90
""",
        passing="test_hours_and_minutes",
        failing="test_seconds",
    ),
    MiniRepo(
        name="casing",
        prompt="to_snake('HTTPServer') returns 'h_t_t_p_server'; runs of capitals are one word: 'http_server' "
        "(and 'parseJSONData' -> 'parse_json_data').",
        buggy='''"""Identifier casing."""

import re


def to_snake(name: str) -> str:
    """camelCase or PascalCase `name` in snake_case."""
    return re.sub(r"(?<!^)([A-Z])", r"_\\1", name).lower()
''',
        fixed='''"""Identifier casing."""

import re


def to_snake(name: str) -> str:
    """camelCase or PascalCase `name` in snake_case."""
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\\1_\\2", name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\\1_\\2", name).lower()
''',
        visible_test="""from casing import to_snake


def test_camel_case():
    assert to_snake("helloWorld") == "hello_world"
""",
        hidden_test="""

def test_acronyms():
    assert [to_snake(n) for n in ("HTTPServer", "parseJSONData")] == ["http_server", "parse_json_data"]
""",
        passing="test_camel_case",
        failing="test_acronyms",
    ),
    MiniRepo(
        name="flatten",
        prompt="flatten([1, [2, [3, [4]]]]) returns [1, 2, [3, [4]]]; it should flatten every level: [1, 2, 3, 4].",
        buggy='''"""Flatten nested lists."""


def flatten(items: list) -> list:
    """Every non-list element of the nested list `items`, in order."""
    out: list = []
    for item in items:
        if isinstance(item, list):
            out.extend(item)
        else:
            out.append(item)
    return out
''',
        fixed='''"""Flatten nested lists."""


def flatten(items: list) -> list:
    """Every non-list element of the nested list `items`, in order."""
    out: list = []
    for item in items:
        if isinstance(item, list):
            out.extend(flatten(item))
        else:
            out.append(item)
    return out
''',
        visible_test="""from flatten import flatten


def test_one_level():
    assert flatten([1, [2, 3], 4]) == [1, 2, 3, 4]
""",
        hidden_test="""

def test_deep_nesting():
    assert flatten([1, [2, [3, [4]]]]) == [1, 2, 3, 4]
""",
        passing="test_one_level",
        failing="test_deep_nesting",
    ),
    MiniRepo(
        name="calendar_utils",
        prompt="is_leap(1900) returns True; century years are leap years only when divisible by 400 "
        "(1900 is not, 2000 is).",
        buggy='''"""Calendar helpers."""


def is_leap(year: int) -> bool:
    """Whether `year` is a leap year in the Gregorian calendar."""
    return year % 4 == 0
''',
        fixed='''"""Calendar helpers."""


def is_leap(year: int) -> bool:
    """Whether `year` is a leap year in the Gregorian calendar."""
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
''',
        visible_test="""from calendar_utils import is_leap


def test_ordinary_years():
    assert (is_leap(2024), is_leap(2023)) == (True, False)
""",
        hidden_test="""

def test_century_years():
    assert (is_leap(1900), is_leap(2000)) == (False, True)
""",
        passing="test_ordinary_years",
        failing="test_century_years",
    ),
]

"""Text from test ids that is safe where it lands.

Test ids, reprs and messages come from users (parametrize ids, ``__repr__``, file names), so what
lands in a report is made inert: ``md_text`` for summary.md (GitHub markdown, where
``|`` splits table cells, newlines end rows and HTML renders), ``csv_cell`` for CSV files
(OWASP's CSV-injection rule), ``file_stem`` for file names (one path component, bounded length).
"""

from __future__ import annotations

import re


def file_stem(text: str, limit: int = 120) -> str:
    """``text`` as one safe path component: runs of anything but letters, digits, '_', '.' and '-'
    become '_', no dots or '_' at either end (no '..', no hidden files), at most ``limit`` characters (ASCII, so
    bytes), "check" when nothing is left. A name built from it stays in its directory."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_.")[:limit] or "check"


#: Characters that GitHub markdown would read as syntax, and what stands for them: backslash
#: escapes for markdown, visible escapes for line breaks. ``<`` is an entity where it could open an
#: HTML tag, comment or autolink (before a letter, '/', '!' or '?'); "<= 0.5" stays as it is.
_MARKDOWN = {"\\": "\\\\", "|": "\\|", "`": "\\`", "*": "\\*", "[": "\\[", "]": "\\]", "\r": "\\r", "\n": "\\n"}
_SYNTAX = re.compile(r"[\\|`*\[\]\r\n]|<(?=[A-Za-z/!?])")


def md_text(text) -> str:
    """``text`` as literal markdown text, safe in a table cell, a list item or a heading: no
    character of it can end the row or line, split a cell, open a code span, a link, emphasis or
    an HTML tag."""
    return _SYNTAX.sub(lambda m: _MARKDOWN.get(m.group(), "&lt;"), str(text))


#: First characters that make a spreadsheet read a cell as a formula (OWASP, CSV injection).
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value):
    """A CSV cell that a spreadsheet shows as text: a string beginning with ``FORMULA_START`` gets a
    leading single quote (OWASP's rule). Numbers the tool computed stay numbers (-0.25 is data)."""
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return value

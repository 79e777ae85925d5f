"""A YAML document with line numbers: every mapping key and list item of a suite remembers
where it was written, so that an error names the file, the line and the key
(``robust_digits.yaml:14: checks[1].perturbation: ...``)."""

from __future__ import annotations

import yaml

from pytest_robust.checks.registry import suggest
from pytest_robust.errors import SuiteError

KeyPath = tuple  # mapping keys (str) and list indices (int) from the document root


# ---------------------------------------------------------------------------------------------
# errors and the located YAML document
# ---------------------------------------------------------------------------------------------


def key_name(path: KeyPath) -> str:
    """``("checks", 1, "perturbation")`` -> ``"checks[1].perturbation"``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def shown_value(value) -> str:
    """A value for an error message: its YAML kind and (shortened) text."""
    kind = {dict: "a mapping", list: "a list", str: "the text", bool: "the boolean"}.get(type(value))
    if kind is None:
        kind = "null" if value is None else "the number" if isinstance(value, (int, float)) else type(value).__name__
    text = "" if value is None else " " + (repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "...")
    return kind + text


class SuiteDocument:
    """A suite file's parsed YAML (``data``) and the line of every mapping key and list item.

    Keys must be text and unique within their mapping (plain YAML would turn ``yes:`` into a
    boolean and keep the last of two equal keys silently).
    """

    def __init__(self, where: str, text: str):
        self.where = where
        self.lines: dict[KeyPath, int] = {(): 1}
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            self.data = loader.construct_document(node) if node is not None else None
        except yaml.MarkedYAMLError as err:
            mark = err.problem_mark or err.context_mark
            line = mark.line + 1 if mark else 1
            raise SuiteError(where, line, "", f"invalid YAML: {err.problem or err.context}") from None
        except yaml.YAMLError as err:
            raise SuiteError(where, 1, "", f"invalid YAML: {err}") from None
        finally:
            loader.dispose()
        if node is not None:
            self._index(node, ())

    def _index(self, node, path: KeyPath) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                line = key.start_mark.line + 1
                if key.tag.endswith(":merge"):
                    continue
                if not (isinstance(key, yaml.ScalarNode) and key.tag.endswith(":str")):
                    shown = key.value if isinstance(key, yaml.ScalarNode) else "a non-scalar key"
                    raise SuiteError(self.where, line, key_name(path), f"key {shown!r} must be text; quote it")
                child = path + (key.value,)
                if child in self.lines:
                    raise SuiteError(self.where, line, key_name(child),
                                     f"duplicate key (first given on line {self.lines[child]})")
                self.lines[child] = line
                self._index(value, child)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                self.lines[path + (index,)] = item.start_mark.line + 1
                self._index(item, path + (index,))

    def line(self, path: KeyPath) -> int:
        """The line of ``path``, or of its nearest enclosing key that has one."""
        while path not in self.lines:
            path = path[:-1]
        return self.lines[path]

    def error(self, path: KeyPath, problem: str) -> SuiteError:
        return SuiteError(self.where, self.line(path), key_name(path), problem)

    def expect(self, path: KeyPath, value, kind: type, what: str):
        """``value`` if it is a ``kind`` (booleans are never numbers), else a located error."""
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise self.error(path, f"expected {what}, got {shown_value(value)}")
        return value

    def mapping(self, path: KeyPath, value, what: str) -> dict:
        """``value`` if it is a mapping, {} if it is null (``settings:`` left empty)."""
        return {} if value is None else self.expect(path, value, dict, what)

    def no_unknown_keys(self, path: KeyPath, mapping: dict, allowed, what: str) -> None:
        for key in mapping:
            if key not in allowed:
                raise self.error(path + (key,), f"unknown key{suggest(key, allowed)}; {what}: {', '.join(allowed)}")

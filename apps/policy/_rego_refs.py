"""Which top-level input fields a Rego rule can read, found from the policy text (for the decision cache).

A memory GET, PUT or DELETE passes the key, and a PUT the whole value, to authz.rego and attributes.rego. The
built-in policies read only ``input.namespace`` and ``input.context``, yet with the whole input as the cache key
every new key or value was a miss: two full evaluations on every write. When the text proves that a rule reads no
other field, its decision for one input is its decision for every input that agrees on the fields it reads, so the
cache may key on those fields alone.

Rego reaches the input only through the root document ``input``: there is no eval, and a string cannot become a
reference. The analysis is therefore a scan for the token ``input`` outside strings and comments:

* ``input.name`` and ``input["name"]`` (also in ``import input.name``) read the field ``name``;
* any other use (``input`` alone, ``input[x]``, ``object.get(input, ...)``, ``walk(input, ...)``, ``import input``)
  can read everything, and the rule then keys on the whole input.

Which modules a rule can reach is decided just as conservatively: every module whose package path is a prefix or an
extension of the rule's path, and every module at all as soon as one of those mentions ``data`` (a reference that
can reach any package). A text the scanner cannot follow (an unterminated string, no package line) reads
everything. Being wrong in the safe direction only costs a cache miss; nothing here can make a miss a hit.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

# None: the rule may read the whole input. Otherwise the top-level fields it may read.
Fields = frozenset[str] | None

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_STRING_KEY = re.compile(r'\[\s*"((?:[^"\\\n]|\\.)*)"\s*\]')
_PACKAGE = re.compile(r"(?<![A-Za-z0-9_])package\s+([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)\s*(?:\n|$)")


class _Unreadable(Exception):
    """The scanner cannot follow the text; callers fall back to "reads everything"."""


def code_only(text: str) -> str:
    """``text`` with every string literal and comment replaced by spaces of the same length (newlines kept), so what
    remains is only code. Raises _Unreadable on an unterminated string."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        if char == "#":
            end = text.find("\n", i)
            end = n if end == -1 else end
            out[i:end] = " " * (end - i)
            i = end
        elif char == '"':
            j = i + 1
            while j < n and text[j] != '"':
                if text[j] == "\n":
                    raise _Unreadable("newline in a string")
                j += 2 if text[j] == "\\" else 1
            if j >= n:
                raise _Unreadable("unterminated string")
            out[i : j + 1] = "".join(c if c == "\n" else " " for c in text[i : j + 1])
            i = j + 1
        elif char == "`":
            end = text.find("`", i + 1)
            if end == -1:
                raise _Unreadable("unterminated raw string")
            out[i : end + 1] = "".join(c if c == "\n" else " " for c in text[i : end + 1])
            i = end + 1
        else:
            i += 1
    return "".join(out)


def _tokens(code: str, word: str) -> Iterator[int]:
    """Positions of ``word`` as a whole identifier in ``code``."""
    for match in re.finditer(rf"(?<![A-Za-z0-9_]){word}(?![A-Za-z0-9_])", code):
        yield match.start()


def input_fields(text: str) -> Fields:
    """The top-level input fields one module's text can read; None when it can read the whole input."""
    try:
        code = code_only(text)
    except _Unreadable:
        return None
    return _fields_in(code, text)


def _fields_in(code: str, text: str) -> Fields:
    fields: set[str] = set()
    for start in _tokens(code, "input"):
        if start > 0 and code[start - 1] == ".":
            return None  # `x.input`: not the root document, but not worth telling apart
        rest = start + len("input")
        while rest < len(code) and code[rest] in " \t":
            rest += 1
        if code.startswith(".", rest):
            name = _IDENT.match(code, rest + 1)
            if name is None:
                return None
            fields.add(name.group())
        elif code.startswith("[", rest):
            # The key must be a plain string literal; it was blanked in `code`, so read it from the original text.
            key = _STRING_KEY.match(text, rest)
            if key is None or "\\" in key.group(1):
                return None
            fields.add(key.group(1))
        else:
            return None
    return frozenset(fields)


@dataclass(frozen=True)
class _Module:
    """What the analysis needs of one module's text, read once."""

    package: tuple[str, ...] | None  # None: no package line the scanner can read
    mentions_data: bool
    fields: Fields


def _read_module(text: str) -> _Module:
    try:
        code = code_only(text)
    except _Unreadable:
        return _Module(None, True, None)
    package = _PACKAGE.search(code)
    return _Module(
        tuple(package.group(1).split(".")) if package else None,
        next(_tokens(code, "data"), None) is not None,
        _fields_in(code, text),
    )


def rule_fields(entrypoint: str, sources: Iterable[str]) -> Fields:
    """The top-level input fields the rule at ``entrypoint`` ("memories/authz/decision") can read, given the texts
    of every module compiled with it; None when it may read the whole input."""
    modules = [_read_module(text) for text in sources]
    if any(module.package is None for module in modules):
        return None
    path = tuple(entrypoint.split("/"))
    reached = [module for module in modules if module.package[: len(path)] == path[: len(module.package)]]
    if any(module.mentions_data for module in reached):
        reached = modules
    fields: set[str] = set()
    for module in reached:
        if module.fields is None:
            return None
        fields |= module.fields
    return frozenset(fields)

"""The JSON parser every DRF view uses (REST_FRAMEWORK's DEFAULT_PARSER_CLASSES): DRF's, plus a nesting limit.

Python's JSON decoder recurses once per nesting level, and so do the serializers, the policy input and the value
encoder behind it: a body nested a few thousand levels deep would end in RecursionError, a 500. The depth is
therefore measured on the raw text, without recursion, before anything parses it.
"""

from __future__ import annotations

import codecs
import re
from typing import Any

from django.conf import settings
from rest_framework import parsers
from rest_framework.exceptions import ParseError
from rest_framework.utils import json

from apps.core import errors

_TO_PARENS = bytes.maketrans(b"[{]}", b"(())")
_NOT_STRUCTURE = bytes(byte for byte in range(256) if byte not in b'"[]{}')
_RUNS = re.compile(rb"\(+|\)+")


def nesting_exceeds(data: bytes, limit: int) -> bool:
    """Whether the UTF-8 JSON ``data`` nests arrays/objects more than ``limit`` levels deep (``{}`` is one level).

    Iterative, and every step but the last runs in C: escapes and everything but quotes and brackets are dropped,
    brackets inside strings are cut out, innermost ``()`` pairs are peeled off a level at a time while that shrinks
    the text fast (leaf arrays and objects), and the rest is measured run by run. Exact for valid JSON; for
    malformed text it may answer either way, but never misses an unclosed run deep enough to make the decoder
    recurse. Text with no more opening brackets than ``limit`` (nearly every body) costs two counts.
    """
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    if b"\\" in data:
        # Escapes pair up left to right: drop escaped backslashes, then escaped quotes; what is left of a
        # backslash escapes an ordinary character and is dropped with it below.
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    # Two adjacent quotes delimit an empty string or join two strings: dropping them keeps every bracket on its
    # side of the string boundaries and leaves few quotes to split on.
    marks = data.translate(_TO_PARENS, _NOT_STRUCTURE).replace(b'""', b"")
    brackets = b"".join(marks.split(b'"')[::2])  # even pieces lie outside strings
    peeled = 0
    while peeled < limit:
        # Every deepest level is an adjacent pair, so one pass takes exactly one level off balanced text.
        inner = brackets.replace(b"()", b"")
        if len(inner) == len(brackets):
            break
        peeled += 1
        shrank_fast = len(inner) * 4 < len(brackets) * 3
        brackets = inner
        if not shrank_fast:
            break
    depth = peeled
    for run in _RUNS.findall(brackets):
        if run[0] == ord("("):
            depth += len(run)
            if depth > limit:
                return True
        else:
            depth -= len(run)
    return False


def too_deep_error(limit: int, field: str = "body") -> errors.ApiError:
    return errors.validation_error(
        {field: f"JSON nested deeper than {limit} levels (the limit, JSON_MAX_DEPTH)"},
        f"Request JSON is nested deeper than the limit of {limit} levels.",
    )


class JSONParser(parsers.JSONParser):
    """DRF's JSONParser with the nesting limit ``settings.JSON_MAX_DEPTH`` checked before decoding."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict | None = None) -> Any:
        encoding = parsers.get_encoding(parser_context or {})
        raw = stream.read()
        try:
            text = raw.decode(encoding)
        except ValueError as exc:  # UnicodeDecodeError
            raise ParseError(f"JSON parse error - {exc}") from None
        if codecs.lookup(encoding).name != "utf-8":
            # The scan needs an ASCII-compatible encoding, where a quote or bracket byte is always that character.
            raw = text.encode("utf-8", "surrogatepass")
        limit = settings.JSON_MAX_DEPTH
        if nesting_exceeds(raw, limit):
            raise too_deep_error(limit)
        try:
            return json.loads(text, parse_constant=json.strict_constant if self.strict else None)
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None

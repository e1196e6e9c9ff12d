"""Passing values into and out of rego-cpp without regopy's lossy conversions (regopy==1.5.2, pinned).

Three defects of rego-cpp/regopy 1.5.2 make the convenience layer unsafe for authorization:

* rego-cpp keeps strings in JSON-escaped form and takes input strings as if already escaped: an input user id
  ``"bob"`` (quotes included) compares equal to the literal ``"bob"``, so a user named that way would own bob's
  namespace. Input strings are therefore JSON-escaped before they are handed over (``_encode``).
* ``Output`` parses rego-cpp's JSON rendering, which does not escape strings (``a\\b`` comes back as
  ``a<backspace>``, ``a"b`` does not parse, ``bo\\u0062`` reads back as ``bob``). The result tree is read node by
  node instead and each string unescaped exactly once (``_decode``).
* ``Input`` hands strings to C as NUL-terminated buffers, so ``"bob\\x00x"`` would reach the policy as ``"bob"``.
  Any string with a NUL is refused (no stored namespace or user id can contain one anyway).

Known residue: string built-ins (count, startswith, ...) see the escaped form, so their answers are off for strings
holding quotes, backslashes or control characters; equality, which authorization rests on, is exact.

All of it uses regopy's own ctypes bindings (``regopy.rego_shared``), the same calls its classes make.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from apps.core.native import preload_before_regopy

preload_before_regopy()  # torch must load before regopy (see apps.core.native)
import regopy  # noqa: E402
from regopy import rego_shared as _c  # noqa: E402

from apps.policy.engine import UNDEFINED, PolicyEvaluationError  # noqa: E402

_lib = _c.rego
_OK = 0
_MAX_DEPTH = 64
_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f]')  # exactly what json.dumps(ensure_ascii=False) escapes

_TERM = int(regopy.NodeKind.Term)
_SCALAR = int(regopy.NodeKind.Scalar)
_ARRAY = int(regopy.NodeKind.Array)
_SET = int(regopy.NodeKind.Set)
_OBJECT = int(regopy.NodeKind.Object)
_INT = int(regopy.NodeKind.Int)
_FLOAT = int(regopy.NodeKind.Float)
_STRING = int(regopy.NodeKind.String)
_BOOLEAN = int(regopy.NodeKind.Boolean)
_TRUE = int(regopy.NodeKind.True_)
_FALSE = int(regopy.NodeKind.False_)
_NULL = int(regopy.NodeKind.Null)
_UNDEFINED = int(regopy.NodeKind.Undefined)
_TERMS = int(regopy.NodeKind.Terms)
_RESULTS = int(regopy.NodeKind.Results)
_RESULT = int(regopy.NodeKind.Result)


def _encode(text: str) -> bytes:
    # rego-cpp keeps strings in JSON-escaped form (what a literal "a\"b" compiles to) and compares that form; a raw
    # input string is taken as already escaped, so '"bob"' would equal "bob". Escaping first makes input strings
    # compare like the literals they spell. Non-ASCII stays as-is, as in literals written in UTF-8.
    if _NEEDS_ESCAPE.search(text) is None:  # the common case: nothing json.dumps would change
        return text.encode("utf-8")
    return json.dumps(text, ensure_ascii=False)[1:-1].encode("utf-8")


def _decode(value: str) -> str:
    # Literals and escaped input come back as escaped content; strings made by built-ins (object.get defaults,
    # concat, sprintf) come back quoted. Escaped content never starts with a bare quote, so the two cannot be confused.
    quoted = value if len(value) >= 2 and value[0] == '"' and value[-1] == '"' else f'"{value}"'
    try:
        decoded = json.loads(quoted)
    except ValueError:
        raise PolicyEvaluationError("rego-cpp returned a string that is not valid escaped text") from None
    if not isinstance(decoded, str):
        raise PolicyEvaluationError("rego-cpp returned a string that is not valid escaped text")
    return decoded


def set_input(interpreter: regopy.Interpreter, value: Any) -> None:
    """Make ``value`` (JSON-shaped: dict with str keys, list/tuple, str, int, float, bool, None) the input."""
    handle = _c.rego_new_input()
    try:
        _add(handle, value, 0)
        if _lib.regoSetInput(interpreter._impl, handle) != _OK:
            raise PolicyEvaluationError("rego-cpp refused the policy input")
    finally:
        _c.rego_free_input(handle)  # rego-cpp copied it into the interpreter


def _add(handle: int, value: Any, depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise PolicyEvaluationError("policy input is nested too deeply")
    if value is True or value is False:
        status = _lib.regoInputBoolean(handle, value)
    elif value is None:
        status = _lib.regoInputNull(handle)
    elif isinstance(value, str):
        if "\x00" in value:
            raise PolicyEvaluationError("policy input contains a NUL character")
        status = _lib.regoInputString(handle, _encode(value))
    elif isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise PolicyEvaluationError("policy input holds an integer outside 64 bits")
        status = _lib.regoInputInt(handle, value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise PolicyEvaluationError("policy input holds a non-finite number")
        status = _lib.regoInputFloat(handle, value)
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise PolicyEvaluationError("policy input object keys must be strings")
            _add(handle, key, depth + 1)
            _add(handle, item, depth + 1)
            if _lib.regoInputObjectItem(handle) != _OK:
                raise PolicyEvaluationError("rego-cpp refused the policy input")
        status = _lib.regoInputObject(handle, len(value))
    elif isinstance(value, (list, tuple)):
        for item in value:
            _add(handle, item, depth + 1)
        status = _lib.regoInputArray(handle, len(value))
    else:
        raise PolicyEvaluationError(f"cannot pass a {type(value).__name__} to a policy")
    if status != _OK:
        raise PolicyEvaluationError("rego-cpp refused the policy input")


def query(interpreter: regopy.Interpreter, bundle: regopy.Bundle, entrypoint: str) -> Any:
    """Evaluate ``entrypoint``; its JSON value, or UNDEFINED. PolicyEvaluationError on a rego-cpp error."""
    try:
        output = _c.rego_bundle_query_entrypoint(interpreter._impl, bundle._impl, entrypoint)
    except regopy.RegoError as exc:
        raise PolicyEvaluationError(f"rego-cpp could not run {entrypoint}: {exc}") from None
    try:
        if not _lib.regoOutputOk(output):
            # Runtime errors (conflicting values, a failing built-in) come back as an error output.
            raise PolicyEvaluationError(f"rego-cpp evaluation error in {entrypoint}")
        root = _c.rego_output_node(output)
        kind = _lib.regoNodeType(root)
        if kind == _UNDEFINED:
            return UNDEFINED
        if kind != _RESULTS or _lib.regoNodeSize(root) != 1:
            raise PolicyEvaluationError(f"{entrypoint} did not produce exactly one result")
        result = _c.rego_node_get(root, 0)
        if _lib.regoNodeType(result) != _RESULT:
            raise PolicyEvaluationError(f"unexpected rego-cpp output shape for {entrypoint}")
        for index in range(_lib.regoNodeSize(result)):
            terms = _c.rego_node_get(result, index)
            if _lib.regoNodeType(terms) == _TERMS:
                if _lib.regoNodeSize(terms) != 1:
                    raise PolicyEvaluationError(f"{entrypoint} did not produce exactly one value")
                return to_python(_c.rego_node_get(terms, 0))
        return UNDEFINED
    finally:
        _c.rego_free_output(output)


def to_python(node: int, depth: int = 0) -> Any:
    """A rego-cpp value node → JSON-shaped Python (sets become lists, as OPA renders them)."""
    if depth > _MAX_DEPTH:
        raise PolicyEvaluationError("policy result is nested too deeply")
    kind = _lib.regoNodeType(node)
    if kind in (_TERM, _SCALAR):
        return to_python(_c.rego_node_get(node, 0), depth + 1)
    if kind == _STRING:
        return _decode(_c.rego_node_value(node))
    if kind == _INT:
        return int(_c.rego_node_value(node))
    if kind == _FLOAT:
        return float(_c.rego_node_value(node))
    if kind in (_BOOLEAN, _TRUE, _FALSE):
        return _c.rego_node_value(node) == "true" if kind == _BOOLEAN else kind == _TRUE
    if kind == _NULL:
        return None
    if kind in (_ARRAY, _SET):
        return [to_python(_c.rego_node_get(node, i), depth + 1) for i in range(_lib.regoNodeSize(node))]
    if kind == _OBJECT:
        result: dict[str, Any] = {}
        for i in range(_lib.regoNodeSize(node)):
            item = _c.rego_node_get(node, i)
            key = to_python(_c.rego_node_get(item, 0), depth + 1)
            if not isinstance(key, str):
                raise PolicyEvaluationError("policy result has a non-string object key")
            result[key] = to_python(_c.rego_node_get(item, 1), depth + 1)
        return result
    raise PolicyEvaluationError(f"unexpected rego-cpp value kind {kind}")

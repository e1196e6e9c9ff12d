"""Deeply nested JSON is a 400 naming the limit, never a 500 (issue 7, item 2), for every JSON body the service
parses: the check sits in the one JSON parser every DRF view uses, and runs before anything recursive."""

from __future__ import annotations

import base64
import json
import random
from typing import Any

import pytest
from django.conf import settings
from django.urls import get_resolver
from rest_framework.views import APIView

from apps.core.parsers import JSONParser, nesting_exceeds

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.runtime.urls_probe")]

HOSTILE_DEPTH = 3000


def nested(depth: int, leaf: Any = 1) -> Any:
    """``depth`` levels of alternating objects and arrays around ``leaf`` (built iteratively)."""
    value = leaf
    for level in range(depth):
        value = {"n": value} if level % 2 else [value]
    return value


def deep_text(depth: int) -> str:
    """The JSON text of ``nested(depth)``, built as text: json.dumps itself would recurse too deep."""
    opening = "".join('{"n":' if level % 2 else "[" for level in reversed(range(depth)))
    closing = "".join("}" if level % 2 else "]" for level in range(depth))
    return opening + "1" + closing


def assert_too_deep(response, limit: int) -> None:
    assert response.status_code == 400, response.content
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert body["code"] == "validation_error"
    assert body["requestId"] == response["X-Request-ID"]
    assert str(limit) in body["error"]
    assert str(limit) in body["details"]["fields"]["body"]


def put_body(value_text: str) -> str:
    return '{"namespace": ["user", "bob"], "key": "deep", "value": {"v": ' + value_text + "}}"


# --- through HTTP ------------------------------------------------------------------------------------------------


def test_deep_memory_value_is_400(client_for):
    response = client_for("bob").put(
        "/v1/memories", data=put_body(deep_text(HOSTILE_DEPTH)), content_type="application/json"
    )
    assert_too_deep(response, settings.JSON_MAX_DEPTH)


def test_deep_search_filter_is_400(client_for):
    body = '{"namespace_prefix": ["user", "bob"], "filter": {"a": ' + deep_text(HOSTILE_DEPTH) + "}}"
    response = client_for("bob").post("/v1/memories/search", data=body, content_type="application/json")
    assert_too_deep(response, settings.JSON_MAX_DEPTH)


def test_deep_body_of_any_drf_view_is_400(api):
    """A view with no JSON handling of its own (a probe) gets the limit from the default parser."""
    response = api.post("/probe/echo", data=deep_text(HOSTILE_DEPTH), content_type="application/json")
    assert_too_deep(response, settings.JSON_MAX_DEPTH)


def test_unclosed_deep_body_is_400(api):
    """Malformed and deep: the decoder would recurse before finding the missing brackets."""
    response = api.post("/probe/echo", data="[" * HOSTILE_DEPTH, content_type="application/json")
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "validation_error"


def test_deep_body_in_another_charset_is_400(api):
    response = api.post(
        "/probe/echo", data=deep_text(HOSTILE_DEPTH).encode("utf-16"), content_type="application/json; charset=utf-16"
    )
    assert_too_deep(response, settings.JSON_MAX_DEPTH)


def test_limit_is_a_setting_and_exact(client_for, settings):
    """The whole body is level 1; a body exactly JSON_MAX_DEPTH deep is accepted, one more level is not."""
    settings.JSON_MAX_DEPTH = 10
    bob = client_for("bob")
    # the body (level 1) > value (2) > eight levels under "v" = 10
    at_limit = bob.put("/v1/memories", data=put_body(deep_text(8)), content_type="application/json")
    assert at_limit.status_code == 200, at_limit.content
    stored = bob.get("/v1/memories?ns=user&ns=bob&key=deep").json()["value"]
    assert stored == {"v": nested(8)}
    over = bob.put("/v1/memories", data=put_body(deep_text(9)), content_type="application/json")
    assert_too_deep(over, 10)


def test_brackets_inside_strings_do_not_count(client_for, settings):
    settings.JSON_MAX_DEPTH = 4
    value = {"text": "[[[[[[{{{{{{", "quote": 'say \\"[[[[[[" "\\\\', "k[[[[[": "]]]]]]"}
    response = client_for("bob").put(
        "/v1/memories", {"namespace": ["user", "bob"], "key": "s", "value": value}, format="json"
    )
    assert response.status_code == 200, response.content


def test_realistic_value_within_the_default_limit(client_for):
    """The default admits everything a memory value may hold (the value's own limit is 32 levels)."""
    assert settings.JSON_MAX_DEPTH >= 34
    response = client_for("bob").put(
        "/v1/memories", data=put_body(deep_text(30)), content_type="application/json"
    )
    assert response.status_code == 200, response.content


def test_deep_cursor_is_400(client_for):
    cursor = base64.urlsafe_b64encode(b"[" * HOSTILE_DEPTH + b"]" * HOSTILE_DEPTH).rstrip(b"=").decode()
    response = client_for("bob").get(f"/v1/memories/events?after_cursor={cursor}")
    assert response.status_code == 400, response.content
    assert response.json()["details"]["fields"] == {"after_cursor": "malformed cursor"}


def test_every_drf_view_parses_json_with_the_limit():
    """A future view that brings its own JSON parser would lose the limit: none may."""
    assert settings.REST_FRAMEWORK["DEFAULT_PARSER_CLASSES"] == ["apps.core.parsers.JSONParser"]
    views = []

    def walk(patterns) -> None:
        for pattern in patterns:
            if hasattr(pattern, "url_patterns"):
                walk(pattern.url_patterns)
                continue
            view_class = getattr(pattern.callback, "cls", None) or getattr(pattern.callback, "view_class", None)
            if isinstance(view_class, type) and issubclass(view_class, APIView):
                views.append(view_class)

    walk(get_resolver("config.urls").url_patterns)
    assert views
    for view_class in views:
        for parser in view_class().get_parsers():
            if "json" in parser.media_type:
                assert isinstance(parser, JSONParser), f"{view_class.__name__} parses JSON without the depth limit"


# --- the scanner -------------------------------------------------------------------------------------------------


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(item) for item in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(item) for item in value), default=0)
    return 0


_AWKWARD_STRINGS = ["", "[", "]]", "{[", '"', '""', "\\", "\\\\", '\\"[', "]\\", "é[", "\u2028}", "x"]


def _random_value(rng: random.Random, depth: int) -> Any:
    if depth == 0 or rng.random() < 0.15:
        return rng.choice([1, 2.5, None, True, *_AWKWARD_STRINGS])
    if rng.random() < 0.5:
        return [_random_value(rng, depth - 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(_AWKWARD_STRINGS) + str(i): _random_value(rng, depth - 1) for i in range(rng.randint(0, 3))}


def test_scanner_agrees_with_the_real_depth_on_random_documents():
    rng = random.Random(7)
    for _ in range(2000):
        value = _random_value(rng, rng.randint(0, 10))
        text = json.dumps(value, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 1])).encode()
        depth = _depth(value)
        for limit in range(0, 11):
            assert nesting_exceeds(text, limit) == (depth > limit), (text, limit, depth)


@pytest.mark.parametrize(
    "text",
    [
        b"[" * HOSTILE_DEPTH,
        b'{"a":' * HOSTILE_DEPTH,
        b"[" * HOSTILE_DEPTH + b'"',
        b'["x]]", ' + b"[" * HOSTILE_DEPTH,
        b"[" * 100 + b"]" * 100 + b"[" * HOSTILE_DEPTH,
    ],
)
def test_scanner_catches_unclosed_deep_text(text):
    assert nesting_exceeds(text, 64)


def test_scanner_on_wide_documents():
    wide = json.dumps({"v": [[index, {"k": "[" * (index % 5)}] for index in range(20000)]}).encode()
    assert not nesting_exceeds(wide, 4)
    assert nesting_exceeds(wide, 3)

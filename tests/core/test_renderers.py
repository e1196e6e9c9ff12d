"""The orjson renderer writes the bytes DRF's JSONRenderer writes, for everything the API returns."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid

import pytest
from django.utils.translation import gettext_lazy
from rest_framework.renderers import JSONRenderer as DrfJSONRenderer

from apps.core.renderers import JSONRenderer

DOCUMENTS = [
    {"id": uuid.UUID("12345678-1234-5678-1234-567812345678"), "n": 1, "f": 0.25, "big": 2**63 - 1, "neg": -(2**63)},
    {"when": dt.datetime(2026, 11, 23, 14, 15, 55, 488281, tzinfo=dt.UTC), "day": dt.date(2026, 11, 23)},
    {"naive": dt.datetime(2026, 1, 2, 3, 4, 5), "time": dt.time(1, 2, 3), "delta": dt.timedelta(seconds=90)},
    {"amount": decimal.Decimal("1.50"), "lazy": gettext_lazy("hello"), "none": None, "yes": True},
    {"text": "naïve 日本語 🎉 \u2028 \u2029 \"quoted\" \\ \n\t", "nested": [[{"a": [1, 2, {"b": None}]}]]},
    {1: "int key", "items": [], "empty": {}},
    [1, "two", 3.0],
    "just a string",
]


@pytest.mark.parametrize("document", DOCUMENTS)
def test_bytes_are_drf_bytes(document) -> None:
    assert JSONRenderer().render(document, "application/json", {}) == DrfJSONRenderer().render(document, "application/json", {})


def test_no_data_is_no_body() -> None:
    assert JSONRenderer().render(None) == b""


def test_a_pretty_print_request_is_drf_pretty_print() -> None:
    document = {"a": [1, {"b": 2}]}
    ours = JSONRenderer().render(document, "application/json; indent=4", {})
    assert ours == DrfJSONRenderer().render(document, "application/json; indent=4", {})
    assert b"\n    " in ours


def test_what_orjson_refuses_fails_exactly_as_drf_fails() -> None:
    document = {"text": "\ud800"}  # a lone surrogate cannot be encoded as UTF-8
    with pytest.raises(UnicodeEncodeError):
        DrfJSONRenderer().render(document, "application/json", {})
    with pytest.raises(UnicodeEncodeError):
        JSONRenderer().render(document, "application/json", {})


def test_integers_past_64_bits_still_render() -> None:
    assert JSONRenderer().render({"n": 2**70}) == b'{"n":1180591620717411303424}'


def test_non_finite_floats_render_as_null() -> None:
    # The one documented difference from DRF, whose strict encoder raises ValueError (a 500) on these.
    document = {"nan": float("nan"), "inf": float("inf"), "ninf": float("-inf"), "ok": 1.5}
    assert JSONRenderer().render(document, "application/json", {}) == b'{"nan":null,"inf":null,"ninf":null,"ok":1.5}'
    with pytest.raises(ValueError):
        DrfJSONRenderer().render(document, "application/json", {})

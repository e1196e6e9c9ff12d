"""Cost of the JSON nesting check (apps.core.parsers.nesting_exceeds) next to json.loads of the same body.

The check runs on every JSON request body before it is decoded; this shows it stays a small fraction of decoding
for ordinary bodies and for hostile ones up to the 2 MiB body limit.

Run: ``.venv/bin/python bench/json_depth.py``
"""

from __future__ import annotations

import json
import os
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")

from apps.core.parsers import nesting_exceeds

LIMIT = 64


def _bodies() -> dict[str, bytes]:
    def put(value: object) -> bytes:
        return json.dumps({"namespace": ["user", "bob"], "key": "k", "value": value}).encode()

    return {
        "small value (few brackets)": put({"likes": "flat white", "n": 3}),
        "value, 50 small objects": put({"items": [{"a": [1, 2], "b": "x"} for _ in range(50)]}),
        "1 MiB string": put({"text": "x" * (1 << 20)}),
        "2 MiB of 200k tiny arrays": put([[index] for index in range(200_000)]),
        "2 MiB of strings holding brackets": put(["a[{" for _ in range(250_000)]),
        "2 MiB, 40k nested objects": put([{"k": i, "n": {"x": [1, {"y": "z"}]}} for i in range(40_000)]),
        "3,000 levels (refused)": b'{"value":' + b"[" * 3000 + b"]" * 3000 + b"}",
        "2 MiB unclosed '[' (refused)": b"[" * (2 << 20),
    }


def main() -> None:
    print(f"{'body':40} {'bytes':>9} {'check':>10} {'json.loads':>11}  deep?")
    for name, body in _bodies().items():
        runs = max(1, min(2000, 2_000_000 // max(len(body), 1)))
        check = min(timeit.repeat(lambda body=body: nesting_exceeds(body, LIMIT), number=runs, repeat=3)) / runs
        deep = nesting_exceeds(body, LIMIT)
        if deep:
            decode = "-"
        else:
            seconds = min(timeit.repeat(lambda body=body: json.loads(body), number=runs, repeat=3)) / runs
            decode = f"{seconds * 1000:.3f} ms"
        print(f"{name:40} {len(body):>9} {check * 1000:>7.3f} ms {decode:>11}  {deep}")


if __name__ == "__main__":
    main()

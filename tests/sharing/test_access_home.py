"""apps.sharing owns its tables: every other app asks apps.sharing.access (issue 24), so who may do what with a
conversation is decided in one place."""

from __future__ import annotations

import re
from pathlib import Path

APPS = Path(__file__).resolve().parents[2] / "apps"
SHARING_TABLE_IN_SQL = re.compile(
    r"\b(?:FROM|JOIN|INTO|UPDATE|DELETE\s+FROM)\s+conversation_(?:memberships|ownership_transfers)\b", re.IGNORECASE
)


def test_no_other_app_reads_or_writes_the_sharing_tables() -> None:
    offenders = [
        f"{path.relative_to(APPS.parent)}:{number}"
        for path in sorted(APPS.rglob("*.py"))
        if not path.is_relative_to(APPS / "sharing") and "migrations" not in path.parts
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if SHARING_TABLE_IN_SQL.search(line)
    ]
    assert offenders == [], "use apps.sharing.access (its functions or SQL fragments) instead"

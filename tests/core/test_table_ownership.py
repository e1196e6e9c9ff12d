"""Each app owns its tables (issue 29): no app's SQL names another app's table.

An app's tables are those of its Django models (``db_table``) and any its migrations create with raw SQL. Another
app that needs them calls the owner's functions; where one query must join across apps, the owner exports a
function returning the fragment with its parameters (``apps.core.db.SqlFragment``), so the table's name stays in
the owner's files. This scans every non-migration module under ``apps/`` for string literals that are SQL (they
hold an SQL keyword in capitals) and name a table of another app; docstrings are prose and are skipped.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from django.apps import apps as django_apps
from django.conf import settings

APPS_DIR = Path(settings.BASE_DIR) / "apps"
_SQL_KEYWORD = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|FROM|JOIN|INTO|TABLE|WITH|EXISTS)\b")
# (file, table): strings that read as SQL but are none (the reason beside each).
NOT_SQL = {
    # One of the sample texts the ONNX export embeds to check itself against the reference model.
    ("apps/retrieval/embeddings/onnx_export.py", "memories"),
}
_RAW_CREATE = re.compile(r"CREATE\s+(?:UNLOGGED\s+)?TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?\"?(\w+)", re.IGNORECASE)


def tables_by_app() -> dict[str, set[str]]:
    """``apps.<label>`` → the tables it owns: its models' and those its migrations create with raw SQL."""
    owned: dict[str, set[str]] = {}
    for config in django_apps.get_app_configs():
        if not config.name.startswith("apps."):
            continue
        tables = {model._meta.db_table for model in config.get_models(include_auto_created=True)}
        migrations = Path(config.path) / "migrations"
        for migration in migrations.glob("*.py") if migrations.is_dir() else ():
            tables.update(_RAW_CREATE.findall(migration.read_text()))
        owned[config.name] = tables
    return owned


def _docstrings(tree: ast.AST) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def _strings(tree: ast.AST) -> Iterator[tuple[ast.expr, str]]:
    """Every string literal but docstrings, an f-string with ``{}`` where its expressions are; an f-string's parts
    are not reported twice."""
    skip = _docstrings(tree)
    parts: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = ""
            for value in node.values:
                parts.add(id(value))
                text += value.value if isinstance(value, ast.Constant) else "{}"
            yield node, text
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip | parts:
            yield node, node.value


def foreign_table_uses(path: Path, owner: str, owned: dict[str, set[str]]) -> list[str]:
    """``file:line: table (owned by app)`` for each use of another app's table in ``path``'s strings."""
    foreign = {table: app for app, tables in owned.items() if app != owner for table in tables}
    if not foreign:
        return []
    # A table's name as a word: not part of a longer identifier, a dotted name or a path segment.
    name = re.compile(r'(?<![\w./-])"?(' + "|".join(map(re.escape, sorted(foreign, key=len, reverse=True))) + r')"?(?![\w/-])')
    source = path.read_text()
    lines = source.splitlines()
    found: list[str] = []
    for node, text in _strings(ast.parse(source, str(path))):
        if not _SQL_KEYWORD.search(text):
            continue
        where = str(path.relative_to(APPS_DIR.parent))
        for table in sorted({match.group(1) for match in name.finditer(text)} - {t for f, t in NOT_SQL if f == where}):
            # The line of the literal piece that holds the name (an implicit concatenation spans several lines).
            span = range(node.lineno, (node.end_lineno or node.lineno) + 1)
            line = next((number for number in span if name.search(lines[number - 1])), node.lineno)
            found.append(f"{where}:{line}: {table} (owned by {foreign[table]})")
    return found


def _owner(path: Path) -> str:
    """The app a module belongs to: the package under ``apps/`` it is in (one that owns no table owns none)."""
    return f"apps.{path.relative_to(APPS_DIR).parts[0]}"


def test_every_app_owns_tables_and_the_scan_sees_them():
    owned = tables_by_app()
    assert {"conversations", "conversation_entries", "conversation_entry_vectors"} <= owned["apps.conversations"]
    assert {"conversation_memberships", "conversation_ownership_transfers"} <= owned["apps.sharing"]
    assert {"memories", "memory_events", "memory_vectors"} <= owned["apps.memories"]
    assert {"attachments", "attachment_links"} <= owned["apps.attachments"]


def test_the_scan_finds_a_foreign_table_in_sql_and_ignores_prose(tmp_path):
    owned = {"apps.a": {"things"}, "apps.b": {"others"}}
    module = tmp_path / "apps" / "b" / "mod.py"
    module.parent.mkdir(parents=True)
    module.write_text(
        '"""Reads things, in prose: not SQL."""\n'
        'SQL = "SELECT x FROM others o " \\\n'
        '      "JOIN things t ON t.id = o.id"\n'
        'PATH = "/v1/things"\n'
        'NAME = "things"\n'
        'def f(a):\n'
        '    return f"SELECT 1 FROM {a} JOIN things"\n'
    )
    global APPS_DIR
    saved, APPS_DIR = APPS_DIR, tmp_path / "apps"
    try:
        assert foreign_table_uses(module, "apps.b", owned) == [
            "apps/b/mod.py:3: things (owned by apps.a)",
            "apps/b/mod.py:7: things (owned by apps.a)",
        ]
    finally:
        APPS_DIR = saved


def test_no_app_names_another_apps_table():
    owned = tables_by_app()
    found: list[str] = []
    for path in sorted(APPS_DIR.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        found += foreign_table_uses(path, _owner(path), owned)
    assert found == [], "tables used outside their app:\n" + "\n".join(found)

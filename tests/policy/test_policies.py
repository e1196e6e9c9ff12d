"""Memory policies (D4): the built-in defaults, per-file fallback, reloads, failures, and the OPA sidecar engine."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured

from apps.core import errors
from apps.core.metrics import POLICY_DECISIONS
from apps.policy import current as policy_current
from apps.policy import engine as policy_engine
from apps.policy.engine import Decision, FilterResult, PolicyCompileError
from apps.policy.opa_engine import OpaEngine
from apps.policy.regopy_engine import RegopyEngine
from tests.local_http import LocalHTTPServer

BUILTIN = Path(django_settings.BASE_DIR) / "policies"
DENIED = Decision(False, "access denied")
ALLOWED = Decision(True, None)


ROLE_NAMES = {"admin": "admin", "auditor": "auditor", "indexer": "indexer"}  # the defaults, as policy_context passes


def ctx(user: str = "alice", roles: tuple[str, ...] = ("user",), **extra: Any) -> dict[str, Any]:
    return {"user_id": user, "jwt_claims": {"sub": user, "roles": list(roles)}, "role_names": ROLE_NAMES, **extra}


def authz_input(namespace: list[str], operation: str = "read", **context: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"operation": operation, "namespace": namespace, "key": "k", "context": ctx(**context)}
    if operation == "write":
        data.update(value={"text": "hello"}, index={"text": "hello"})
    return data


def filter_input(prefix: list[str] | None, **context: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"filter": {}, "context": ctx(**context)}
    if prefix is not None:
        data["namespace_prefix"] = prefix
    return data


@pytest.fixture
def builtin() -> RegopyEngine:
    engine = RegopyEngine(None, BUILTIN)
    engine.load()
    return engine


def custom_engine(directory: Path, **files: str) -> RegopyEngine:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / f"{name}.rego").write_text(text)
    engine = RegopyEngine(directory, BUILTIN, reload_interval=0)
    engine.load()
    return engine


# --- built-in defaults (interface "Built-in default behaviour" 1-5) ----------------------------------------------


@pytest.mark.parametrize("operation", ["read", "write", "delete"])
@pytest.mark.parametrize("namespace", [["user", "alice"], ["user", "alice", "notes"], ["user", "alice", "a", "b", "c"]])
def test_own_namespace_allowed(builtin, operation, namespace):
    assert builtin.authorize(authz_input(namespace, operation)) == ALLOWED


@pytest.mark.parametrize("operation", ["read", "write", "delete"])
@pytest.mark.parametrize(
    "namespace",
    [
        ["user", "bob"],
        ["user", "bob", "notes"],
        ["shared", "alice"],
        ["shared"],
        ["user"],
        ["alice", "alice"],
        ["user", "alic"],
        ["user", "alice "],
        ["User", "alice"],
    ],
)
def test_other_namespaces_denied(builtin, operation, namespace):
    assert builtin.authorize(authz_input(namespace, operation)) == DENIED


@pytest.mark.parametrize("operation", ["read", "write", "delete"])
def test_admin_does_not_bypass_authz(builtin, operation):
    assert builtin.authorize(authz_input(["user", "bob"], operation, roles=("user", "admin"))) == DENIED
    assert builtin.authorize(authz_input(["user", "alice"], operation, roles=("admin",))) == ALLOWED


def test_authz_without_user_id_is_denied(builtin):
    assert builtin.authorize({"operation": "read", "namespace": ["user", "alice"], "key": "k", "context": {}}) == DENIED
    assert builtin.authorize({"operation": "read", "namespace": ["user", "alice"]}) == DENIED


def test_attributes(builtin):
    def attributes(namespace: list[str]) -> dict[str, Any]:
        return builtin.attributes(
            {"namespace": namespace, "key": "k", "value": {"a": 1}, "index": {}, "context": ctx("alice")}
        )

    assert attributes(["user", "alice"]) == {"namespace": "user", "sub": "alice"}
    assert attributes(["user", "alice", "notes", "deep"]) == {"namespace": "user", "sub": "alice"}
    assert attributes(["shared", "team-a"]) == {"namespace": "shared", "sub": "team-a"}
    assert attributes(["user"]) == {}
    assert attributes([]) == {}


ALICE_FILTER = {"namespace": "user", "sub": "alice"}


@pytest.mark.parametrize(
    ("requested", "expected_prefix"),
    [
        (None, ["user", "alice"]),
        ([], ["user", "alice"]),
        (["user"], ["user", "alice"]),
        (["user", "alice"], ["user", "alice"]),
        (["user", "alice", "notes"], ["user", "alice", "notes"]),
        (["user", "alice", "notes", "x"], ["user", "alice", "notes", "x"]),
        # Disjoint from the caller's subtree: a prefix inside it that no stored namespace matches (empty result).
        (["user", "bob"], ["user", "alice", ""]),
        (["user", "bob", "notes"], ["user", "alice", ""]),
        (["user", "al"], ["user", "alice", ""]),
        (["shared"], ["user", "alice", ""]),
    ],
)
def test_filter_non_admin_is_confined_to_own_subtree(builtin, requested, expected_prefix):
    result = builtin.filter(filter_input(requested))
    assert result == FilterResult(expected_prefix, ALICE_FILTER)
    assert result.namespace_prefix[:2] == ["user", "alice"]


@pytest.mark.parametrize("requested", [[], ["user"], ["user", "bob"], ["shared", "x"], ["user", "alice", "notes"]])
def test_filter_admin_keeps_prefix_and_gets_no_attribute_filter(builtin, requested):
    assert builtin.filter(filter_input(requested, roles=("user", "admin"))) == FilterResult(requested, {})


def test_filter_admin_without_prefix_is_unconstrained(builtin):
    assert builtin.filter(filter_input(None, roles=("admin",))) == FilterResult([], {})


def test_filter_without_user_id_fails_closed(builtin):
    result = builtin.filter({"namespace_prefix": ["user"], "filter": {}, "context": {"jwt_claims": {"roles": []}}})
    assert result == FilterResult(["user", ""], {"namespace": "user", "sub": ""})
    result = builtin.filter({"namespace_prefix": [], "filter": {}})
    assert result.attribute_filter == {"namespace": "user", "sub": ""}


def test_role_named_like_admin_is_not_admin(builtin):
    result = builtin.filter(filter_input(["user", "bob"], roles=("administrator", "Admin")))
    assert result == FilterResult(["user", "alice", ""], ALICE_FILTER)


def test_filter_admin_is_the_configured_admin_role(builtin):
    # Issue 21.21: the built-in policy reads the service's ADMIN_ROLE (input.context.role_names.admin), not "admin".
    boss = {**ROLE_NAMES, "admin": "boss"}
    assert builtin.filter(filter_input(["user", "bob"], roles=("boss",), role_names=boss)) == FilterResult(
        ["user", "bob"], {}
    )
    assert builtin.filter(filter_input(["user", "bob"], roles=("admin",), role_names=boss)) == FilterResult(
        ["user", "alice", ""], ALICE_FILTER
    )


def test_filter_without_role_names_makes_nobody_admin(builtin):
    data = filter_input(["user", "bob"], roles=("admin",))
    del data["context"]["role_names"]
    assert builtin.filter(data) == FilterResult(["user", "alice", ""], ALICE_FILTER)


def test_policy_context_carries_the_configured_role_names(settings):
    from apps.identity.principal import Principal

    settings.ADMIN_ROLE, settings.AUDITOR_ROLE, settings.INDEXER_ROLE = "boss", "viewer", "idx"
    context = policy_engine.policy_context(Principal(user_id="alice", client_id=None, roles=("boss",)))
    assert context["role_names"] == {"admin": "boss", "auditor": "viewer", "indexer": "idx"}


TRICKY_IDS = ['a"b', "a\\b", "bo\\u0062", '"bob"', "a\nb", "é😀", "x\\", "\\u0000", "%_.*"]


@pytest.mark.parametrize("user", TRICKY_IDS)
def test_special_characters_compare_and_round_trip_exactly(builtin, user):
    # rego-cpp keeps strings escaped internally; the engine must neither merge distinct strings nor alter results.
    assert builtin.authorize(authz_input(["user", user, "x"], user=user)) == ALLOWED
    assert builtin.authorize(authz_input(["user", "bob"], user=user)) == DENIED
    assert builtin.attributes({"namespace": ["user", user], "context": ctx(user)}) == {"namespace": "user", "sub": user}
    assert builtin.filter(filter_input(["user"], user=user)) == FilterResult(
        ["user", user], {"namespace": "user", "sub": user}
    )
    deeper = ["user", user, 'n"s\\']
    assert builtin.filter(filter_input(deeper, user=user)).namespace_prefix == deeper
    assert builtin.filter(filter_input(deeper, user=user, roles=("admin",))) == FilterResult(deeper, {})


def test_quoted_user_id_does_not_own_the_unquoted_namespace(builtin):
    assert builtin.authorize(authz_input(["user", "bob"], user='"bob"')) == DENIED
    assert builtin.authorize(authz_input(["user", '"bob"'], user="bob")) == DENIED
    assert builtin.filter(filter_input(["user", "bob"], user='"bob"')).namespace_prefix == ["user", '"bob"', ""]


@pytest.mark.parametrize(
    "data",
    [
        {"namespace": ["user", "bob\x00x"], "context": ctx("bob")},
        {"namespace": ["user", "bob"], "context": ctx("bob\x00evil")},
        {"namespace": ["user", "bob"], "context": ctx("bob"), "value": {"k\x00": 1}},
        {"namespace": ["user", "bob"], "context": ctx("bob"), "value": {"n": 2**64}},
        {"namespace": ["user", "bob"], "context": ctx("bob"), "value": {"n": float("nan")}},
        {"namespace": ["user", "bob"], "context": ctx("bob"), "value": {1: "non-string key"}},
    ],
)
def test_inputs_rego_cpp_cannot_represent_are_policy_errors(builtin, data):
    # A NUL would truncate the string inside rego-cpp ("bob\x00x" → "bob"): refuse rather than evaluate another input.
    with pytest.raises(errors.ApiError) as info:
        builtin.authorize(data)
    assert (info.value.status, info.value.code) == (500, "policy_error")


def test_check_and_readiness(builtin):
    builtin.check()


def _in_threads(worker: Any, count: int) -> None:
    """worker(0) .. worker(count - 1), each on its own thread, all at once; returns when every one has finished."""
    threads = [threading.Thread(target=worker, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_concurrent_evaluations_are_correct(builtin):
    failures: list[str] = []

    def worker(n: int) -> None:
        user = f"user{n}"
        for i in range(200):
            own = i % 2 == 0
            namespace = ["user", user if own else "someone-else", "x"]
            decision = builtin.authorize(authz_input(namespace, user=user))
            if decision.allow is not own:
                failures.append(f"{user} {namespace} {decision}")

    _in_threads(worker, 8)
    assert failures == []


def test_concurrent_evaluations_share_a_bounded_pool_of_interpreters(monkeypatch):
    # Each compiled interpreter holds ~0.8 MB: 8 threads evaluating at once build at most `interpreters` of them.
    from apps.policy import regopy_engine

    engine = RegopyEngine(None, BUILTIN, interpreters=2)
    engine.load()  # as at start-up (check_or_die)
    compiled = []
    real_compile = regopy_engine._compile
    monkeypatch.setattr(regopy_engine, "_compile", lambda sources: compiled.append(1) or real_compile(sources))
    failures: list[str] = []

    def worker(n: int) -> None:
        for i in range(100):
            namespace = ["user", f"user{n}", f"x{i}"]  # a new input each call: evaluated, not answered from the cache
            if not engine.authorize(authz_input(namespace, user=f"user{n}")).allow:
                failures.append(f"user{n} {namespace}")

    _in_threads(worker, 8)
    assert failures == []
    assert 1 <= len(compiled) <= 2
    assert len(engine._idle) == len(compiled)


# --- custom directories: per-file fallback, reload, compile errors -----------------------------------------------

SHARED_AUTHZ = """
package memories.authz

import rego.v1

default decision := {"allow": false, "reason": "not yours"}

decision := {"allow": true} if {
	input.namespace[0] == "user"
	input.namespace[1] == input.context.user_id
}

decision := {"allow": true} if input.namespace[0] == "shared"
"""

TEAM_ATTRIBUTES = """
package memories.attributes

import rego.v1

default attributes := {}

attributes := {"team": input.namespace[1], "owner": input.context.user_id, "level": 3, "public": false} if {
	input.namespace[0] == "team"
}
"""


def test_per_file_fallback(tmp_path):
    engine = custom_engine(tmp_path / "policies", authz=SHARED_AUTHZ)
    assert [p.parent for p in engine.files()] == [tmp_path / "policies", BUILTIN, BUILTIN]
    assert engine.authorize(authz_input(["shared", "board"])) == ALLOWED
    assert engine.authorize(authz_input(["user", "bob"])) == Decision(False, "not yours")
    assert engine.attributes({"namespace": ["shared", "board"], "context": ctx()}) == {
        "namespace": "shared",
        "sub": "board",
    }
    assert engine.filter(filter_input(["user", "bob"])) == FilterResult(["user", "alice", ""], ALICE_FILTER)


def test_custom_attributes_policy(tmp_path):
    engine = custom_engine(tmp_path / "p", attributes=TEAM_ATTRIBUTES)
    attributes = engine.attributes({"namespace": ["team", "red", "notes"], "key": "k", "context": ctx("alice")})
    assert attributes == {"team": "red", "owner": "alice", "level": 3, "public": False}
    assert engine.attributes({"namespace": ["user", "alice"], "context": ctx()}) == {}
    assert engine.authorize(authz_input(["team", "red"])) == DENIED  # authz stays the built-in


def test_empty_directory_uses_builtins(tmp_path):
    engine = custom_engine(tmp_path / "empty")
    assert [p.parent for p in engine.files()] == [BUILTIN, BUILTIN, BUILTIN]
    assert engine.authorize(authz_input(["user", "alice"])) == ALLOWED


def test_missing_directory_is_a_start_error(tmp_path):
    with pytest.raises(PolicyCompileError, match="does not exist"):
        RegopyEngine(tmp_path / "nope", BUILTIN).load()


def _touch_later(path: Path, text: str) -> None:
    # Some filesystems keep mtimes at coarse resolution: force a visibly different mtime as well as new content.
    path.write_text(text)
    later = time.time() + 5
    os.utime(path, (later, later))


def test_reload_on_file_change(tmp_path):
    directory = tmp_path / "p"
    engine = custom_engine(directory)
    assert engine.authorize(authz_input(["shared", "x"])) == DENIED

    _touch_later(directory / "authz.rego", SHARED_AUTHZ)  # a file appears: it now overrides the built-in
    assert engine.authorize(authz_input(["shared", "x"])) == ALLOWED

    _touch_later(directory / "authz.rego", SHARED_AUTHZ.replace('"shared"', '"public"'))
    assert engine.authorize(authz_input(["shared", "x"])) == Decision(False, "not yours")
    assert engine.authorize(authz_input(["public", "x"])) == ALLOWED

    (directory / "authz.rego").unlink()  # removed: back to the built-in
    assert engine.authorize(authz_input(["public", "x"])) == DENIED


def test_reload_is_rate_limited(tmp_path):
    directory = tmp_path / "p"
    directory.mkdir()
    engine = RegopyEngine(directory, BUILTIN, reload_interval=3600)
    engine.load()
    _touch_later(directory / "authz.rego", SHARED_AUTHZ)
    assert engine.authorize(authz_input(["shared", "x"])) == DENIED  # not looked at again within the interval


def test_broken_reload_keeps_previous_policy(tmp_path, caplog):
    directory = tmp_path / "p"
    engine = custom_engine(directory, authz=SHARED_AUTHZ)
    _touch_later(directory / "authz.rego", "package memories.authz\nimport rego.v1\ndecision := {\n")
    with caplog.at_level("ERROR"):
        assert engine.authorize(authz_input(["shared", "x"])) == ALLOWED
        assert engine.authorize(authz_input(["shared", "x"])) == ALLOWED
    rejected = [r for r in caplog.records if "rejected" in r.getMessage()]
    assert len(rejected) == 1  # logged once per change, not on every check
    _touch_later(directory / "authz.rego", SHARED_AUTHZ.replace('"shared"', '"public"'))
    assert engine.authorize(authz_input(["public", "x"])) == ALLOWED  # a fixed file is picked up again


def test_syntax_error_at_start_is_a_clear_error(tmp_path):
    directory = tmp_path / "p"
    directory.mkdir()
    (directory / "filter.rego").write_text("package memories.filter\nimport rego.v1\nnamespace_prefix := [\n")
    with pytest.raises(ImproperlyConfigured) as info:
        RegopyEngine(directory, BUILTIN).load()
    message = str(info.value)
    assert "do not compile" in message
    assert f"{directory / 'filter.rego'}:3:" in message  # file:line:column of the unclosed bracket


def test_load_or_die_uses_settings(settings, tmp_path):
    directory = tmp_path / "p"
    directory.mkdir()
    (directory / "authz.rego").write_text("package memories.authz\ndecision := {{{\n")
    settings.SERVICE_POLICY_DIR = str(directory)
    with pytest.raises(ImproperlyConfigured, match=r"authz\.rego"):
        policy_current.load_or_die()
    settings.SERVICE_POLICY_DIR = ""
    policy_current.load_or_die()
    assert isinstance(policy_current.get_engine(), RegopyEngine)


def test_get_engine_follows_settings(settings, tmp_path):
    settings.SERVICE_POLICY_DIR = ""
    first = policy_current.get_engine()
    assert policy_current.get_engine() is first
    settings.SERVICE_POLICY_DIR = str(tmp_path)
    second = policy_current.get_engine()
    assert second is not first and second.policy_dir == tmp_path
    settings.POLICY_ENGINE = "opa"
    assert isinstance(policy_current.get_engine(), OpaEngine)
    settings.POLICY_ENGINE = "nonsense"
    with pytest.raises(ImproperlyConfigured, match="POLICY_ENGINE"):
        policy_current.get_engine()


# --- malformed results and evaluation errors → 500 policy_error ---------------------------------------------------


@pytest.mark.parametrize(
    ("files", "call"),
    [
        ({"authz": 'package memories.authz\ndecision := {"allow": "yes"}\n'}, "authorize"),
        ({"authz": "package memories.authz\ndecision := true\n"}, "authorize"),
        ({"authz": 'package memories.authz\ndecision := {"reason": "no allow"}\n'}, "authorize"),
        ({"authz": 'package memories.authz\ndecision := {"allow": true, "reason": 5}\n'}, "authorize"),
        ({"attributes": 'package memories.attributes\nattributes := {"nested": {"a": 1}}\n'}, "attributes"),
        ({"attributes": 'package memories.attributes\nattributes := ["a"]\n'}, "attributes"),
        ({"attributes": 'package memories.attributes\nattributes := {"big": 1e400}\n'}, "attributes"),
        ({"filter": 'package memories.filter\nnamespace_prefix := "user"\n'}, "filter"),
        ({"filter": "package memories.filter\nnamespace_prefix := [1, 2]\n"}, "filter"),
        ({"filter": 'package memories.filter\nattribute_filter := ["sub"]\n'}, "filter"),
        ({"filter": 'package memories.filter\nattribute_filter := {"sub": {"in": [{"deep": 1}]}}\n'}, "filter"),
        # A package that is not memories.filter leaves data.memories.filter undefined: never "no constraint".
        ({"filter": "package other.filter\nnamespace_prefix := []\n"}, "filter"),
        # Conflicting values at run time: an evaluation error.
        (
            {
                "authz": 'package memories.authz\ndecision := {"allow": true} if input.key\n'
                'decision := {"allow": false} if input.key\n'
            },
            "authorize",
        ),
    ],
)
def test_malformed_results_are_policy_errors(tmp_path, files, call):
    engine = custom_engine(tmp_path / "p", **files)
    before = POLICY_DECISIONS.labels({"authorize": "authz"}.get(call, call), "error")._value.get()
    data = authz_input(["user", "alice"]) | {"namespace_prefix": ["user", "alice"]}
    with pytest.raises(errors.ApiError) as info:
        getattr(engine, call)(data)
    assert (info.value.status, info.value.code) == (500, "policy_error")
    assert POLICY_DECISIONS.labels({"authorize": "authz"}.get(call, call), "error")._value.get() == before + 1


def test_undefined_authz_and_attributes_are_the_defaults(tmp_path):
    engine = custom_engine(
        tmp_path / "p",
        authz='package memories.authz\nimport rego.v1\ndecision := {"allow": true} if input.key == "never"\n',
        attributes='package memories.attributes\nimport rego.v1\nattributes := {"a": 1} if input.key == "never"\n',
    )
    assert engine.authorize(authz_input(["user", "alice"])) == DENIED
    assert engine.attributes({"namespace": ["user", "alice"], "key": "k"}) == {}


@pytest.mark.parametrize(
    "rules",
    [
        "unrelated := 1\n",
        'attribute_filter := {"sub": "alice"}\n',  # namespace_prefix undefined: would keep the requested prefix
        'namespace_prefix := ["user", "alice"]\n',  # attribute_filter undefined: would add no filter
        'namespace_prefix := ["user", "alice"] if input.context.user_id == "alice"\nattribute_filter := {}\n',
        "namespace_prefix := null\nattribute_filter := {}\n",
        'namespace_prefix := ["user"]\nattribute_filter := null\n',
    ],
)
def test_filter_leaving_a_rule_undefined_fails_closed(tmp_path, rules):
    # Issue 21.22: an undefined namespace_prefix or attribute_filter is a policy_error, never "no constraint".
    engine = custom_engine(tmp_path / "p", filter=f"package memories.filter\nimport rego.v1\n{rules}")
    with pytest.raises(errors.ApiError) as info:
        engine.filter(filter_input(["x"], user="bob"))
    assert (info.value.status, info.value.code) == (500, "policy_error")


def test_unserializable_input_is_a_policy_error(builtin):
    with pytest.raises(errors.ApiError) as info:
        builtin.authorize({"namespace": ["user", "alice"], "context": ctx(), "value": object()})
    assert info.value.code == "policy_error"


# --- OPA sidecar engine -------------------------------------------------------------------------------------------


class _FakeOpa(LocalHTTPServer):
    """OPA's Data API (POST /v1/data/<path>, GET /health), answering by evaluating the built-in policies with regopy."""

    daemon_threads = True

    def __init__(self, delay: float = 0.0, status: int = 200) -> None:
        super().__init__(("127.0.0.1", 0), _OpaHandler)
        self.delay = delay
        self.status = status
        self.requests: list[tuple[str, Any]] = []
        self._lock = threading.Lock()
        # Imported here, after the engine module: apps.core.native wants torch loaded before regopy.
        import regopy

        self._regopy = regopy
        builder = regopy.Interpreter()
        for name in ("authz", "attributes", "filter"):
            builder.add_module(f"{name}.rego", (BUILTIN / f"{name}.rego").read_text())
        self._builder = builder
        self._bundle = builder.build(
            None, ["memories/authz/decision", "memories/attributes/attributes", "memories/filter"]
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def evaluate(self, path: str, input: Any) -> tuple[bool, Any]:
        with self._lock:  # one interpreter, serialized: this is a test double, not the engine under test
            interpreter = self._regopy.Interpreter()
            interpreter.set_input(self._regopy.Input(input))
            output = interpreter.query_bundle_entrypoint(self._bundle, path)
            if not output.ok():
                raise RuntimeError("evaluation error")
            expressions = output.results[0].expressions if output.results else []
            return (True, expressions[0]) if expressions else (False, None)


class _OpaHandler(BaseHTTPRequestHandler):
    server: _FakeOpa

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._send(200, {}) if self.path == "/health" else self._send(404, {"code": "not_found"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append((self.path, body))
        if self.server.delay:
            time.sleep(self.server.delay)
        if self.server.status != 200:
            self._send(self.server.status, {"code": "internal_error", "message": "eval_conflict_error"})
            return
        path = self.path.removeprefix("/v1/data/")
        if path not in {"memories/authz/decision", "memories/attributes/attributes", "memories/filter"}:
            self._send(200, {})  # OPA: an unknown document is undefined, i.e. no "result"
            return
        defined, value = self.server.evaluate(path, body.get("input"))
        self._send(200, {"result": value} if defined else {})


@pytest.fixture
def fake_opa() -> Iterator[_FakeOpa]:
    server = _FakeOpa()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_opa_engine_default_matrix(fake_opa):
    engine = OpaEngine(fake_opa.url, 2)
    engine.check()
    assert engine.authorize(authz_input(["user", "alice", "notes"], "write")) == ALLOWED
    assert engine.authorize(authz_input(["user", "bob"], "delete")) == DENIED
    assert engine.authorize(authz_input(["user", "bob"], roles=("admin",))) == DENIED
    assert engine.attributes({"namespace": ["user", "alice"], "context": ctx()}) == {
        "namespace": "user",
        "sub": "alice",
    }
    assert engine.attributes({"namespace": ["user"], "context": ctx()}) == {}
    assert engine.filter(filter_input(["user"])) == FilterResult(["user", "alice"], ALICE_FILTER)
    assert engine.filter(filter_input(["user", "bob"], roles=("admin",))) == FilterResult(["user", "bob"], {})
    path, body = fake_opa.requests[0]
    assert path == "/v1/data/memories/authz/decision"
    assert body["input"]["namespace"] == ["user", "alice", "notes"]
    assert [p for p, _ in fake_opa.requests[-4:]] == [
        "/v1/data/memories/attributes/attributes",
        "/v1/data/memories/attributes/attributes",
        "/v1/data/memories/filter",
        "/v1/data/memories/filter",
    ]


def test_opa_undefined_results(fake_opa, monkeypatch):
    engine = OpaEngine(fake_opa.url, 2)
    # Paths the sidecar has no document for: OPA answers without "result".
    monkeypatch.setitem(policy_engine.ENTRYPOINTS, "authz", "missing/authz/decision")
    monkeypatch.setitem(policy_engine.ENTRYPOINTS, "attributes", "missing/attributes")
    monkeypatch.setitem(policy_engine.ENTRYPOINTS, "filter", "missing/filter")
    assert engine.authorize(authz_input(["user", "alice"])) == DENIED
    assert engine.attributes({"namespace": ["user", "alice"], "context": ctx()}) == {}
    with pytest.raises(errors.ApiError) as info:
        engine.filter(filter_input([]))
    assert (info.value.status, info.value.code) == (500, "policy_error")


@pytest.mark.parametrize(
    "document", [{"attribute_filter": {}}, {"namespace_prefix": []}, {"namespace_prefix": None, "attribute_filter": {}}]
)
def test_opa_filter_leaving_a_rule_undefined_fails_closed(fake_opa, monkeypatch, document):
    # The sidecar answers the package document with a rule missing (OPA omits undefined rules): issue 21.22.
    monkeypatch.setattr(fake_opa, "evaluate", lambda path, input: (True, document))
    engine = OpaEngine(fake_opa.url, 2)
    with pytest.raises(errors.ApiError) as info:
        engine.filter(filter_input(["user", "bob"], user="bob"))
    assert (info.value.status, info.value.code) == (500, "policy_error")


def test_opa_evaluation_error_is_policy_error(fake_opa):
    fake_opa.status = 500
    with pytest.raises(errors.ApiError) as info:
        OpaEngine(fake_opa.url, 2).authorize(authz_input(["user", "alice"]))
    assert (info.value.status, info.value.code) == (500, "policy_error")


def test_opa_gateway_error_is_unavailable(fake_opa):
    fake_opa.status = 503
    with pytest.raises(errors.ApiError) as info:
        OpaEngine(fake_opa.url, 2).authorize(authz_input(["user", "alice"]))
    assert (info.value.status, info.value.code) == (503, "unavailable")


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("call", ["authorize", "attributes", "filter"])
def test_opa_unreachable_is_503(call):
    engine = OpaEngine(f"http://127.0.0.1:{_unused_port()}", 2)
    with pytest.raises(errors.ApiError) as info:
        getattr(engine, call)(authz_input(["user", "alice"]))
    assert (info.value.status, info.value.code) == (503, "unavailable")
    with pytest.raises(Exception):
        engine.check()


def test_opa_slow_is_503_after_timeout(fake_opa):
    fake_opa.delay = 2.0
    engine = OpaEngine(fake_opa.url, 0.3)
    started = time.monotonic()
    with pytest.raises(errors.ApiError) as info:
        engine.authorize(authz_input(["user", "alice"]))
    elapsed = time.monotonic() - started
    assert (info.value.status, info.value.code) == (503, "unavailable")
    assert 0.25 < elapsed < 1.5


def test_opa_engine_from_settings(settings, fake_opa):
    settings.POLICY_ENGINE = "opa"
    settings.OPA_URL = fake_opa.url + "/"
    settings.OPA_TIMEOUT_SECONDS = 1
    engine = policy_current.get_engine()
    assert isinstance(engine, OpaEngine) and engine.timeout == 1.0
    assert engine.authorize(authz_input(["user", "alice"])) == ALLOWED
    policy_current.check()


# --- manage.py --policy-dir ---------------------------------------------------------------------------------------


def test_manage_py_policy_dir(monkeypatch, tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("_manage", Path(django_settings.BASE_DIR) / "manage.py")
    assert spec is not None and spec.loader is not None
    manage = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(manage)
    # setenv first so the undo removes what _take_policy_dir sets (a bare delenv of an absent variable records
    # nothing to restore, and the value leaked into every later test and the processes they start).
    monkeypatch.setenv("SERVICE_POLICY_DIR", "")
    monkeypatch.delenv("SERVICE_POLICY_DIR")
    argv = manage._take_policy_dir(["manage.py", "runserver", "--policy-dir", str(tmp_path), "8000"])
    assert argv == ["manage.py", "runserver", "8000"]
    assert os.environ["SERVICE_POLICY_DIR"] == str(tmp_path)
    argv = manage._take_policy_dir(["manage.py", f"--policy-dir={tmp_path}/x", "check"])
    assert argv == ["manage.py", "check"]
    assert os.environ["SERVICE_POLICY_DIR"] == f"{tmp_path}/x"
    with pytest.raises(SystemExit):
        manage._take_policy_dir(["manage.py", "check", "--policy-dir"])


@pytest.fixture(autouse=True)
def _fresh_engine() -> Iterator[None]:
    policy_current.reset_engine()
    yield
    policy_current.reset_engine()


def test_readiness_check_is_registered():
    from apps.core import readiness

    assert readiness._CHECKS["policy_engine"] is policy_current.check
    policy_current.check()


# --- decision cache: a reused decision is the same policy generation on the same input ---------------------------

FLAG_AUTHZ = """package memories.authz
import rego.v1
default decision := {"allow": false, "reason": "no flag"}
decision := {"allow": true} if input.flag == true
"""


def _count_queries(monkeypatch) -> list[str]:
    from apps.policy import _rego_io

    calls: list[str] = []
    real = _rego_io.query

    def counting(interpreter, bundle, entrypoint):
        calls.append(entrypoint)
        return real(interpreter, bundle, entrypoint)

    monkeypatch.setattr(_rego_io, "query", counting)
    return calls


def test_identical_input_reuses_the_decision(builtin, monkeypatch):
    calls = _count_queries(monkeypatch)
    for _ in range(3):
        assert builtin.filter(filter_input([], user="alice")) == FilterResult(
            ["user", "alice"], {"namespace": "user", "sub": "alice"}
        )
    assert len(calls) == 1
    assert builtin.filter(filter_input([], user="bob")).namespace_prefix == ["user", "bob"]  # another input
    assert len(calls) == 2


def test_inputs_equal_only_after_conversion_are_evaluated_separately(tmp_path):
    engine = custom_engine(tmp_path / "p", authz=FLAG_AUTHZ)
    base = {"namespace": ["user", "alice"], "context": ctx()}
    assert engine.authorize({**base, "flag": True}) == ALLOWED
    assert engine.authorize({**base, "flag": 1}) == Decision(False, "no flag")  # 1 is not true in Rego
    assert engine.authorize({**base, "flag": "True"}) == Decision(False, "no flag")
    assert engine.authorize({**base, "flag": True}) == ALLOWED


def test_cached_decision_cannot_be_mutated_by_a_caller(builtin):
    first = builtin.filter(filter_input([], user="alice"))
    first.attribute_filter["sub"] = "mallory"
    first.namespace_prefix.append("x")
    assert builtin.filter(filter_input([], user="alice")) == FilterResult(
        ["user", "alice"], {"namespace": "user", "sub": "alice"}
    )


def test_failed_evaluations_are_not_cached(builtin):
    bad = {"namespace": ["user", "alice"], "context": ctx(), "value": {"n": float("nan")}}
    for _ in range(2):
        with pytest.raises(errors.ApiError):
            builtin.authorize(bad)


def test_policy_with_non_deterministic_builtin_is_never_cached(tmp_path, monkeypatch):
    clock_authz = FLAG_AUTHZ.replace("input.flag == true", "time.now_ns() > 0")
    engine = custom_engine(tmp_path / "p", authz=clock_authz)
    calls = _count_queries(monkeypatch)
    for _ in range(3):
        assert engine.authorize(authz_input(["user", "alice"])) == ALLOWED
    assert len(calls) == 3


def test_large_inputs_bypass_the_cache(tmp_path, monkeypatch):
    # A rule that reads the value keys on it; a value this large is evaluated every time instead of filling the cache.
    engine = custom_engine(tmp_path / "p", authz=FLAG_AUTHZ.replace("input.flag", "input.value.flag"))
    calls = _count_queries(monkeypatch)
    data = {**authz_input(["user", "alice"], operation="write"), "value": {"flag": True, "text": "x" * 10_000}}
    for _ in range(2):
        assert engine.authorize(data) == ALLOWED
    assert len(calls) == 2


def test_writes_reuse_decisions_whatever_their_key_and_value(builtin, monkeypatch):
    # The built-in authz.rego and attributes.rego read only namespace and context: a new key or value is no reason
    # to evaluate again.
    calls = _count_queries(monkeypatch)
    for n in range(5):
        data = {**authz_input(["user", "alice", "notes"], operation="write"), "key": f"k{n}"}
        data["value"] = {"text": "x" * (n * 3000), "n": n}
        assert builtin.authorize(data) == ALLOWED
        assert builtin.attributes(data) == {"namespace": "user", "sub": "alice"}
    assert sorted(calls) == ["memories/attributes/attributes", "memories/authz/decision"]
    assert builtin.authorize(authz_input(["user", "bob"], operation="write")) == DENIED  # another namespace
    assert builtin.authorize(authz_input(["user", "alice", "notes"], operation="write", user="bob")) == DENIED
    assert len(calls) == 4


def test_cached_decisions_do_not_keep_the_request(builtin):
    import gc

    from apps.policy.regopy_engine import _DecisionKey

    value = {"text": "x" * 100_000}
    builtin.authorize({**authz_input(["user", "alice"], operation="write"), "value": value})
    keys = [obj for obj in gc.get_objects() if type(obj) is _DecisionKey]
    assert keys and not [key for key in keys if key.input is not None and key.input.get("value") is value]


# Policies that read the input in every way the reference scanner must follow. Each is checked against uncached
# evaluation on inputs that differ in one field at a time: a field the scanner missed shows up as a stale decision.
TRICKY_AUTHZ = {
    "field": 'decision := {"allow": input.value.flag == true}',
    "string key": 'decision := {"allow": input["value"]["flag"] == true}',
    "import alias": 'import input.value as v\ndecision := {"allow": v.flag == true}',
    "whole input": 'decision := {"allow": object.get(input, ["value", "flag"], false) == true}',
    "iteration": 'decision := {"allow": true} if { some k, v in input; k == "value"; v.flag == true }\n'
    'default decision := {"allow": false}',
    "helper package": 'import data.memories.helpers\ndecision := {"allow": helpers.flagged}',
    "after a string": 'decision := {"allow": x} if { s := "#"; x := input.value.flag == true }',
    "key only": 'decision := {"allow": input.key == "k1"}',
}
HELPERS = "package memories.helpers\nimport rego.v1\nflagged := input.value.flag == true\n"


@pytest.mark.parametrize("name", sorted(TRICKY_AUTHZ))
def test_cached_decisions_match_uncached_evaluation(tmp_path, name):
    # The helper package stands in attributes.rego's place: the three files are what compiles together.
    engine = custom_engine(
        tmp_path / "p", authz=f"package memories.authz\nimport rego.v1\n{TRICKY_AUTHZ[name]}\n", attributes=HELPERS
    )
    inputs = []
    for flag in (True, False, None):
        for key in ("k1", "k2"):
            data = {**authz_input(["user", "alice"], operation="write"), "key": key, "value": {"flag": flag}}
            if flag is None:
                del data["value"]
            inputs.append(data)
    for data in inputs * 2:  # the second pass answers from the cache wherever the rule allows it
        uncached = engine._evaluate_now("authz", data)[0]
        expected = False if uncached is policy_engine.UNDEFINED else uncached["allow"]
        assert engine.authorize(data).allow is expected, data

"""Shared fixtures. Tests talk HTTP to the service (DRF's APIClient through the full middleware stack) against the
real embedded PostgreSQL with pgvector; the session stops the embedded servers it started itself."""

from __future__ import annotations

import os
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any
from urllib.parse import urlencode

import jwt
import pytest
from django.conf import settings
from django.test import Client
from rest_framework.test import APIClient

from apps.runtime import embedded_services
from tests import database
from tests.live_service import INHERITED_ENV, LiveService

pytest_plugins = ["tests.file_order"]

# The key seeded from API_KEYS in config/settings/test.py; its client is "test-client".
TEST_API_KEY = "test-api-key-0123456789"
TEST_API_CLIENT = "test-client"

# Tokens minted per (user, roles, issuer, key) for the whole session: signing RSA per request would dominate runtime.
_token_cache: dict[tuple[Any, ...], tuple[str, int]] = {}


# After each transactional test the tables are emptied by tests.database.empty_tables, not by a flush.
database.install()


def _index_static_files_once() -> None:
    """Every Django test client loads the middleware anew, and WhiteNoise's (WHITENOISE_USE_FINDERS) walked, stat-ed
    and typed every static file (the admin's, DRF's, Swagger UI's) for each one: 45% of the time of the tests that
    make a few clients each (py-spy, tests/sharing). Static files do not change during a session: the first index
    serves every later client, exactly as one web process serves them all."""
    from whitenoise.middleware import WhiteNoiseMiddleware

    indexed: dict[str, dict] = {}
    index = WhiteNoiseMiddleware.add_files_from_finders

    def add_files_from_finders(self: WhiteNoiseMiddleware) -> None:
        files = indexed.get(self.static_prefix)
        if files is None:
            index(self)
            indexed[self.static_prefix] = dict(self.files)
        else:
            self.files.update(files)

    WhiteNoiseMiddleware.add_files_from_finders = add_files_from_finders


_index_static_files_once()


def pytest_configure(config: pytest.Config) -> None:
    """A run whose ``-m`` selects no ``model`` or ``slow`` test does not load torch: config/settings/test.py preloads
    it (before regopy, apps.core.native) for the tests that use it in the test process (model tests compare with it,
    a slow one probes a CUDA device through it), seconds of every process's start-up."""
    torch_tests = ({"model"}, {"model", "live"}, {"model", "slow"}, {"model", "live", "slow"}, {"slow"}, {"live", "slow"})
    if not may_select(config, *torch_tests):
        settings.PRELOAD_TORCH = False


def may_select(config: pytest.Config, *marker_sets: set[str]) -> bool:
    """Whether this run's ``-m`` expression can select a test whose markers among live, slow, model and those named
    are exactly one of ``marker_sets``: False only when it certainly cannot (an expression naming other markers may
    select such a test, as far as this knows)."""
    if not config.option.markexpr:
        return True
    try:
        from _pytest.mark.expression import Expression  # what -m itself evaluates (not public API)

        expression = Expression.compile(config.option.markexpr)
    except Exception:  # a grammar or an API this does not know: assume it can
        return True
    asked: set[str] = set()

    def carrying(markers: set[str]):
        def match(name: str, /, **kwargs: Any) -> bool:
            asked.add(name)
            return name in markers

        return match

    selected = any(expression.evaluate(carrying(markers)) for markers in marker_sets)
    return selected or not asked <= {"live", "slow", "model", *set().union(*marker_sets)}


# Tests that run the service in processes of its own (tests/live_service.py), through these fixtures.
LIVE_FIXTURES = frozenset({"live_service", "web_servers"})


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark by what a test uses: ``live`` for one that talks to a live server through LIVE_FIXTURES. (Tests that
    start servers or workers themselves carry the marker in their module; ``slow`` and ``model`` are written on the
    tests too: README, testing.)"""
    for item in items:
        if LIVE_FIXTURES.intersection(item.fixturenames):
            item.add_marker(pytest.mark.live)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """A node id still shared by several items (another plugin, a Schemathesis that builds items otherwise) stops the
    run at once: xdist would run one of them and lose the others without a word."""
    shared = sorted(nodeid for nodeid, count in Counter(ids).items() if count > 1)
    if shared:
        message = f"{len(shared)} node ids name several tests each (xdist would run one of each), e.g. {shared[0]}"
        pytest.exit(message, returncode=pytest.ExitCode.USAGE_ERROR)


def _main_process(config: pytest.Config) -> bool:
    """The process of a run without xdist, or xdist's controller (never one of its workers)."""
    return not hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    if _main_process(session.config):
        # Stopped at the end if this session's tests started it (_start_embedded_postgres, in whichever process).
        session.config.stash[_POSTGRES_WAS_UP] = embedded_services.running()["postgres"]


def pytest_collection_finish(session: pytest.Session) -> None:
    """When a collected test uses the real model (marker ``model``) and the data directory has no ONNX export of it
    (a clean clone), start the one-off export (about 20 s) in the background: other tests run meanwhile, and the
    first model test waits on the export's lock (apps.retrieval.embeddings.onnx_export) for what is left. One
    process does it: a run's only one, or xdist's first worker (the controller collects nothing)."""
    from apps.retrieval.embeddings import minilm, onnx_export

    worker = getattr(session.config, "workerinput", {}).get("workerid", "gw0")
    if worker != "gw0" or session.config.option.collectonly:
        return
    if not any(item.get_closest_marker("model") for item in session.items):
        return
    cache_dir = settings.EMBEDDING_ONNX_DIR
    if onnx_export.cached_export(cache_dir, minilm.model_path()) is None:
        # Its failure is not reported here: the first model test then exports itself and fails with the reason.
        session.config.stash[_EXPORT] = onnx_export.start_export_subprocess(
            cache_dir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )


_EXPORT = pytest.StashKey["subprocess.Popen[bytes]"]()
_POSTGRES_WAS_UP = pytest.StashKey[bool]()


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> None:
    """pytest-django's hook before it makes the session's test database: start the embedded PostgreSQL, which
    config/settings/test.py leaves to the first test that needs a database."""
    _start_embedded_postgres()


def _start_embedded_postgres() -> None:
    if embedded_services.defer_postgres and not os.environ.get("DATABASE_URL"):
        url = embedded_services.start_postgres()
        assert url == settings.DATABASE_URL, f"the embedded PostgreSQL answers at {url}, settings say {settings.DATABASE_URL}"


def pytest_sessionfinish(session, exitstatus) -> None:
    export = session.config.stash.get(_EXPORT, None)
    if export is not None:  # done long before, unless the model tests were deselected or failed early
        try:
            export.wait(timeout=600)
        except subprocess.TimeoutExpired:
            export.kill()
            export.wait()
    if not _main_process(session.config):
        return  # the controller stops what the session started, once every worker is done with it
    stop = set(embedded_services.started_here)
    if session.config.stash.get(_POSTGRES_WAS_UP, True) is False and embedded_services.running()["postgres"]:
        stop.add("postgres")
    if stop:
        embedded_services.stop(only=stop)


@pytest.fixture
def indexer_wakeups(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the indexer tasks the writes ask a worker to run (apps.retrieval.indexing.Indexer.request_run),
    recorded instead of sent."""
    from types import SimpleNamespace

    from apps.retrieval import indexing

    sent: list[str] = []
    monkeypatch.setattr(indexing, "current_app", SimpleNamespace(send_task=lambda name, **_options: sent.append(name)))
    return sent


@pytest.fixture(autouse=True)
def _redis_circuit_closed() -> None:
    """Each test starts with the Redis circuit closed (apps.core.redis_client): one that made Redis fail must not
    leave the next test skipping Redis until the background ping closes it."""
    from apps.core.redis_client import breaker

    breaker.reset()


@pytest.fixture
def api() -> APIClient:
    """An anonymous client; see ``client_for`` for authenticated ones."""
    return APIClient()


def _mint(
    username: str = "alice",
    *,
    roles: Sequence[str] | None = None,
    claims: dict[str, Any] | None = None,
    drop: Iterable[str] = (),
    headers: dict[str, Any] | None = None,
    key: Any = None,
    algorithm: str = "RS256",
) -> str:
    from apps.identity.dev_idp import issuer, keys, users

    if roles is None:
        dev_user = users.load_users().get(username)
        roles = dev_user.roles if dev_user else ("user",)
    payload = issuer.access_token_claims(username, roles)
    payload.update(claims or {})
    for name in drop:
        payload.pop(name, None)
    signing = keys.signing_key()
    header = {"kid": signing.kid, **(headers or {})}
    return jwt.encode(payload, key if key is not None else signing.private_key, algorithm=algorithm, headers=header)


@pytest.fixture
def mint_token() -> Callable[..., str]:
    """``mint_token(username="alice", *, roles=None, claims=None, drop=(), headers=None, key=None,
    algorithm="RS256") -> str``: a token signed in-process with the dev IdP key (or ``key``), shaped like the dev
    IdP's. ``roles`` defaults to the dev user's roles (``("user",)`` for unknown names); ``claims`` overrides or adds
    claims (e.g. ``{"exp": 0}``, ``{"iss": "https://evil"}``); ``drop`` removes claims; ``headers`` adds or
    overrides JOSE headers (``kid``)."""
    return _mint


@pytest.fixture
def token(api: APIClient) -> Callable[..., str]:
    """``token(username="alice") -> str``: an access token from the real POST /dev-idp/token password grant."""
    from apps.identity.dev_idp import users

    def get(username: str = "alice") -> str:
        form = {
            "grant_type": "password",
            "client_id": settings.DEV_IDP_CLIENT_ID,
            "client_secret": settings.DEV_IDP_CLIENT_SECRET,
            "username": username,
            "password": users.load_users()[username].password,
        }
        response = api.post("/dev-idp/token", urlencode(form), content_type="application/x-www-form-urlencoded")
        assert response.status_code == 200, response.content
        return response.json()["access_token"]

    return get


@pytest.fixture
def client_for() -> Callable[..., APIClient]:
    """``client_for(username, *, api_key=None, roles=None) -> APIClient`` with ``Authorization: Bearer`` set (and
    ``X-API-Key`` when ``api_key`` is given; ``TEST_API_KEY`` is the seeded one). Tokens are minted in-process and
    cached per user for the session. Dev users: alice (user, admin), bob and charlie (user); any other name gets
    roles ``("user",)`` unless ``roles`` says otherwise."""
    from apps.identity.dev_idp import keys

    def make(username: str, *, api_key: str | None = None, roles: Sequence[str] | None = None) -> APIClient:
        cache_key = (username, None if roles is None else tuple(roles), settings.DEV_IDP_ISSUER, keys.signing_key().kid)
        cached = _token_cache.get(cache_key)
        if cached is None or cached[1] - time.time() < 300:
            cached = _mint(username, roles=roles), int(time.time()) + settings.DEV_IDP_TOKEN_LIFETIME_SECONDS
            _token_cache[cache_key] = cached
        client = APIClient()
        credentials = {"HTTP_AUTHORIZATION": f"Bearer {cached[0]}"}
        if api_key is not None:
            credentials["HTTP_X_API_KEY"] = api_key
        client.credentials(**credentials)
        return client

    return make


def wait_until_released(kind: int, timeout: float = 10.0) -> None:
    """Wait for the work leases (apps.retrieval.leases) of a closed database session to go: its backend exits a moment after
    the client hangs up, and its locks go with it."""
    from apps.retrieval import leases

    deadline = time.monotonic() + timeout
    while leases.held_by_others(kind):
        assert time.monotonic() < deadline, "a closed session's leases are still held"
        time.sleep(0.01)


# What a service process started by a test inherits from the test's environment: nothing a test may have set
# (SERVICE_POLICY_DIR, DATABASE_URL, EMBEDDING_*, ...), only what finding programs and temp files needs.
def service_env(**overrides: str) -> dict[str, str]:
    """A clean environment for `manage.py up` / a Celery worker started by a test, plus ``overrides``."""
    import os

    env = {name: os.environ[name] for name in INHERITED_ENV if name in os.environ}
    env.update(overrides)
    return env


@pytest.fixture(scope="session")
def live_service(django_db_setup, django_db_blocker) -> Iterator[LiveService]:
    """The session's shared live server (tests/live_service.py): the production web stack on the test database, two
    workers of 16 request threads each, so 32 concurrent clients are all in flight on the server at once."""
    with django_db_blocker.unblock():
        service = LiveService(workers=2, extra_env={"WSGI_THREADS": "16"})
    service.start()
    try:
        yield service
    finally:
        # Before pytest-django drops the test database: the server's connections would block the DROP.
        service.stop()


@pytest.fixture(scope="module")
def empty_tables_after_module(live_service: LiveService, django_db_blocker) -> Iterator[None]:
    """For modules that write through the live service (which commits): ``pytest.mark.usefixtures`` it with
    ``django_db``. The tables are emptied once after the module, not after every test as
    ``django_db(transaction=True)`` would (about a second per test), so a test scopes what it asserts to what it made."""
    yield
    with django_db_blocker.unblock():
        database.empty_tables()


@pytest.fixture
def own_key_rings(db) -> Iterator[None]:
    """Only this test's key rings are live (apps.encryption.key_rings): the rings the session's live servers and workers
    reported are deleted inside the test (its transaction restores them), so a test that switches
    MEMORY_ENCRYPTION_KEYS (rotation) is not judged against the session's ring. The test's transaction holds the
    reports' lock, so none of theirs lands meanwhile either (a live process's heartbeat, or its first report)."""
    from django.db import connection

    from apps.encryption import key_rings
    from apps.encryption.models import EncryptionKeyRing

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [key_rings._LOCK_ID])
    EncryptionKeyRing.objects.all().delete()
    key_rings._remember_quietly(None)
    yield
    key_rings._remember_quietly(None)


@pytest.fixture
def operator(django_user_model) -> Client:
    """A logged-in Django superuser for the operator pages under /admin/."""
    user = django_user_model.objects.create_superuser("op", "op@example.com", "op-password")
    client = Client()
    client.force_login(user)
    return client

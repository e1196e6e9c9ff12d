"""Per-user request rates (D11, issue 28 item 2): 429 ``rate_limited`` with ``Retry-After`` at each rate's boundary,
through the HTTP API against the session's real Valkey; admin overrides; the refusals counted on /metrics."""

from __future__ import annotations

import time

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command

from apps.limits import services
from apps.limits.definitions import RATES
from tests.conversations.support import assert_error
from tests.limits.conftest import sample

pytestmark = pytest.mark.django_db


def _rate(settings, kind: str, *, per_minute: int, burst: int) -> None:
    setattr(settings, RATES[kind].per_minute_setting, per_minute)
    setattr(settings, RATES[kind].burst_setting, burst)


def assert_rate_limited(response, kind: str) -> int:
    body = assert_error(response, 429, "rate_limited")
    retry_after = response["Retry-After"]
    assert retry_after.isdigit() and int(retry_after) >= 1, retry_after
    assert body["details"] == {"rate": kind, "retryAfterSeconds": int(retry_after)}
    return int(retry_after)


def test_the_default_request_rate_takes_a_burst_then_refuses(client_for, fresh_user, real_rates) -> None:
    """300 rapid calls (the issue's probe): the first `burst` pass, and the limiter refuses within what it refilled
    meanwhile."""
    rate = RATES["requests"]
    client = client_for(fresh_user())
    started = time.monotonic()
    passed = 0
    for _ in range(300):
        response = client.get("/v1/me")
        if response.status_code != 200:
            break
        passed += 1
    elapsed = time.monotonic() - started
    assert_rate_limited(response, "requests")
    assert rate.burst <= passed <= rate.burst + rate.per_minute / 60 * elapsed + 1, (passed, elapsed)


def test_exactly_burst_requests_pass_and_retry_after_names_the_wait(client_for, fresh_user, settings) -> None:
    _rate(settings, "requests", per_minute=60, burst=3)  # one token a second
    client = client_for(fresh_user())
    assert [client.get("/v1/me").status_code for _ in range(3)] == [200, 200, 200]
    refused = client.get("/v1/me")
    assert assert_rate_limited(refused, "requests") == 1
    time.sleep(1.05)
    assert client.get("/v1/me").status_code == 200
    assert client.get("/v1/me").status_code == 429


def test_a_user_over_the_rate_leaves_other_users_alone(client_for, fresh_user, settings) -> None:
    _rate(settings, "requests", per_minute=1, burst=2)
    greedy, other = client_for(fresh_user("greedy")), client_for(fresh_user("other"))
    assert [greedy.get("/v1/me").status_code for _ in range(3)] == [200, 200, 429]
    assert assert_rate_limited(greedy.get("/v1/me"), "requests") >= 59  # a token a minute
    assert other.get("/v1/me").status_code == 200


def test_anonymous_and_unauthenticated_requests_are_not_limited_per_user(api, settings) -> None:
    _rate(settings, "requests", per_minute=1, burst=1)
    assert all(api.get("/v1/me").status_code == 401 for _ in range(3))
    assert all(api.get("/healthz").status_code == 200 for _ in range(3))


def test_searches_have_their_own_tighter_class(client_for, fresh_user, settings) -> None:
    _rate(settings, "searches", per_minute=1, burst=2)
    user = fresh_user("searcher")
    client = client_for(user)
    body = {"namespace_prefix": ["user", user]}
    before = sample("rate_limited_total", kind="searches")
    assert [client.post("/v1/memories/search", body, format="json").status_code for _ in range(2)] == [200, 200]
    assert_rate_limited(client.post("/v1/memories/search", body, format="json"), "searches")
    # The same class covers conversation search; the user's other requests still pass.
    assert_rate_limited(client.post("/v1/conversations/search", {"query": "x"}, format="json"), "searches")
    assert client.get("/v1/me").status_code == 200
    assert sample("rate_limited_total", kind="searches") == before + 2


def test_conversation_creation_forks_and_creating_appends_share_the_creates_class(client_for, fresh_user, settings) -> None:
    """200 conversations in 1 s, 100 forks (the issue's probes) run into the creates class; appending to an
    existing conversation does not."""
    _rate(settings, "creates", per_minute=1, burst=3)
    client = client_for(fresh_user("creator"))
    created = client.post("/v1/conversations", {"title": "one"}, format="json")
    assert created.status_code == 201
    conversation_id = created.json()["id"]
    entry = client.post(
        f"/v1/conversations/{conversation_id}/entries", {"content": [{"role": "USER", "text": "hi"}]}, format="json"
    )
    assert entry.status_code == 201
    new_id = "00000000-0000-4000-8000-000000000001"
    fork = {"content": [{"role": "USER", "text": "fork"}], "forkedAtConversationId": conversation_id,
            "forkedAtEntryId": entry.json()["id"]}
    assert client.post(f"/v1/conversations/{new_id}/entries", fork, format="json").status_code == 201
    assert client.post("/v1/conversations", {}, format="json").status_code == 201
    before = sample("rate_limited_total", kind="creates")
    assert_rate_limited(client.post("/v1/conversations", {}, format="json"), "creates")
    other_new = "00000000-0000-4000-8000-000000000002"
    assert_rate_limited(
        client.post(f"/v1/conversations/{other_new}/entries", {"content": [{"role": "USER", "text": "x"}]},
                    format="json"),
        "creates",
    )
    fork_again = "00000000-0000-4000-8000-000000000003"
    assert_rate_limited(client.post(f"/v1/conversations/{fork_again}/entries", fork, format="json"), "creates")
    # Nothing was created by the refused calls, and appends to existing conversations go on.
    assert client.get(f"/v1/conversations/{other_new}").status_code == 404
    assert client.post(
        f"/v1/conversations/{conversation_id}/entries", {"content": [{"role": "USER", "text": "more"}]}, format="json"
    ).status_code == 201
    assert sample("rate_limited_total", kind="creates") == before + 3


def test_membership_changes_and_transfers_share_the_memberships_class(client_for, fresh_user, settings) -> None:
    _rate(settings, "memberships", per_minute=1, burst=2)
    client = client_for(fresh_user("sharer"))
    conversation_id = client.post("/v1/conversations", {}, format="json").json()["id"]
    path = f"/v1/conversations/{conversation_id}/memberships"
    assert client.post(path, {"userId": "m1", "accessLevel": "reader"}, format="json").status_code == 201
    assert client.patch(f"{path}/m1", {"accessLevel": "writer"}, format="json").status_code == 200
    assert_rate_limited(client.post(path, {"userId": "m2", "accessLevel": "reader"}, format="json"), "memberships")
    assert_rate_limited(
        client.post("/v1/ownership-transfers", {"conversationId": conversation_id, "newOwnerUserId": "m1"},
                    format="json"),
        "memberships",
    )
    assert client.get(path).status_code == 200  # reading the members is an ordinary request


def test_uploads_have_their_own_class(client_for, fresh_user, settings, tmp_path) -> None:
    """12 uploads in 0.6 s (the issue's probe) meet the uploads class (default burst 10)."""
    settings.ATTACHMENT_DIR = str(tmp_path)
    _rate(settings, "uploads", per_minute=1, burst=RATES["uploads"].burst)
    client = client_for(fresh_user("uploader"))
    statuses = []
    for index in range(12):
        file = SimpleUploadedFile(f"f{index}.txt", b"x" * 1024, content_type="text/plain")
        statuses.append(client.post("/v1/attachments", {"file": file}, format="multipart").status_code)
    assert statuses == [201] * RATES["uploads"].burst + [429] * (12 - RATES["uploads"].burst)


def test_an_admin_override_changes_the_users_rate(client_for, fresh_user, settings) -> None:
    _rate(settings, "requests", per_minute=1, burst=2)
    user = fresh_user("vip")
    client = client_for(user)
    services.set_limits(user, {"requests_burst": 5})
    assert [client.get("/v1/me").status_code for _ in range(6)] == [200] * 5 + [429]
    # Back to the default: the bucket's state is kept, so it stays empty until it refills.
    services.set_limits(user, {"requests_burst": None})
    assert client.get("/v1/me").status_code == 429


def test_the_limits_command_sets_a_users_rate(client_for, fresh_user, settings, capsys) -> None:
    _rate(settings, "searches", per_minute=1, burst=1)
    user = fresh_user("cli")
    call_command("limits", "set", user, "--searches-burst", "3", "--note", "load test")
    out = capsys.readouterr().out
    assert "searches_burst" in out and " 3 " in out
    client = client_for(user)
    body = {"namespace_prefix": ["user", user]}
    assert [client.post("/v1/memories/search", body, format="json").status_code for _ in range(4)] == [200] * 3 + [429]


def test_the_admin_page_sets_a_users_rate(client_for, fresh_user, settings, operator) -> None:
    _rate(settings, "requests", per_minute=1, burst=1)
    user = fresh_user("paged")
    form = {field: "" for field in services.OVERRIDE_FIELDS}
    form.update({"user_id": user, "note": "", "requests_burst": "4"})
    response = operator.post("/admin/limits/userlimits/add/", form)
    assert response.status_code == 302, response.content[:2000]
    page = operator.get(f"/admin/limits/userlimits/{user}/change/")
    assert page.status_code == 200 and b"Stored now" in page.content
    client = client_for(user)
    assert [client.get("/v1/me").status_code for _ in range(5)] == [200] * 4 + [429]


@pytest.mark.django_db(transaction=True)
def test_the_rate_is_shared_by_every_web_process(http, fresh_user) -> None:
    """The live server's two worker processes, 40 clients at once: together they never admit more than the user's
    bucket holds (tokens leased ahead by one process are taken from the shared bucket, never given twice), and
    tokens one process leased but had no use for cost the others at most a few."""
    from tests.concurrency import run_concurrently

    user = fresh_user("shared")
    services.set_limits(user, {"requests_per_minute": 1, "requests_burst": 100})
    lease = min(10, 100 // 20)

    def burst(client) -> list[int]:
        return [client.get("/v1/me").status_code for _ in range(5)]

    clients = [http(user) for _ in range(40)]
    results = run_concurrently([lambda c=c: burst(c) for c in clients])
    codes = [code for result in results for code in result]
    assert set(codes) <= {200, 429}
    assert 100 - 2 * (lease - 1) <= codes.count(200) <= 100, codes.count(200)

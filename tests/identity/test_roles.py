"""The role checks (D2) in D1's order, on every endpoint that needs a role: 401 without credentials, 400 for a
malformed request whatever the caller's roles (validation runs before authorization), 403 without the role, and
served with it, an admin's included (admin implies auditor and indexer). apps.identity.permissions is the one place
these checks live."""

from __future__ import annotations

import pytest
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory, force_authenticate
from rest_framework.views import APIView

from apps.identity.permissions import IsAuditor, RoleChecked
from apps.identity.principal import Principal

pytestmark = pytest.mark.django_db

SOME_ID = "1f265a5f-ff90-42b7-b52e-2f732872964c"  # fixed: test ids must be the same in every xdist worker
INDEX_ITEM = {"conversationId": SOME_ID, "entryId": SOME_ID, "indexedContent": "x"}

# (role, method, path, malformed body or query, well-formed body or query)
ENDPOINTS = [
    ("auditor", "get", "/v1/admin/conversations", {"limit": 0}, {}),
    ("auditor", "get", "/v1/admin/conversations", {"includeDeleted": "maybe"}, {"includeDeleted": "true"}),
    ("auditor", "get", f"/v1/admin/conversations/{SOME_ID}/entries", {"channel": "nope"}, {}),
    ("auditor", "get", f"/v1/admin/conversations/{SOME_ID}/forks", {"limit": 1001}, {}),
    ("auditor", "get", f"/v1/admin/conversations/{SOME_ID}/memberships", {"limit": "x"}, {}),
    ("auditor", "post", "/v1/admin/conversations/search", {"query": "   "}, {"query": "x", "searchType": "fulltext"}),
    ("auditor", "get", "/v1/admin/attachments", {"afterCursor": "%%%"}, {}),
    ("auditor", "get", "/v1/admin/attachments", {"userId": "x" * 257}, {"userId": "bob"}),
    ("indexer", "get", "/v1/conversations/unindexed", {"limit": 0}, {}),
    ("indexer", "post", "/v1/conversations/index", [], [INDEX_ITEM]),
]
# Malformed path ids: the same order.
PATHS = [
    ("auditor", "/v1/admin/conversations/{}"),
    ("auditor", "/v1/admin/conversations/{}/entries"),
    ("auditor", "/v1/admin/attachments/{}"),
]
ROLES = {"user": ("user",), "auditor": ("user", "auditor"), "indexer": ("user", "indexer"), "admin": ("user", "admin")}


def _call(client, method: str, path: str, data):
    if method == "get":
        return client.get(path, data)
    return client.post(path, data, format="json")


def _endpoint_id(endpoint) -> str:
    return f"{endpoint[1]} {endpoint[2]} {endpoint[3]}"


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=map(_endpoint_id, ENDPOINTS))
def test_the_role_is_checked_after_validation(api, client_for, endpoint) -> None:
    role, method, path, malformed, valid = endpoint
    assert _call(api, method, path, valid).status_code == 401
    for name, roles in ROLES.items():
        client = client_for(f"roles-{name}", roles=roles)
        bad = _call(client, method, path, malformed)
        assert bad.status_code == 400, (name, bad.content)
        assert bad.json()["code"] == "validation_error"
        good = _call(client, method, path, valid)
        if name in (role, "admin"):
            assert good.status_code in (200, 404), (name, good.content)  # 404: the made-up conversation or entry
        else:
            assert good.status_code == 403, (name, good.content)
            assert good.json()["code"] == "forbidden"
            assert good.json()["error"] == f"Requires the {role} or admin role."


@pytest.mark.parametrize(("role", "path"), [("auditor", "/v1/admin/conversations"), ("indexer", "/v1/conversations/index")])
def test_options_is_for_the_role_too(api, client_for, role, path) -> None:
    """DRF answers OPTIONS itself (the view's metadata), past any handler: it is checked all the same."""
    assert api.options(path).status_code == 401
    for name, roles in ROLES.items():
        response = client_for(f"roles-{name}", roles=roles).options(path)
        assert response.status_code == (200 if name in (role, "admin") else 403), (name, response.content)


@pytest.mark.parametrize(("role", "template"), PATHS)
def test_a_malformed_path_id_is_400_before_the_role(client_for, role, template) -> None:
    for name, roles in ROLES.items():
        response = client_for(f"roles-{name}", roles=roles).get(template.format("not-a-uuid"))
        assert response.status_code == 400, (name, response.content)
        allowed = client_for(f"roles-{name}", roles=roles).get(template.format(SOME_ID))
        assert allowed.status_code == (404 if name in (role, "admin") else 403), (name, allowed.content)


class _Audited(RoleChecked, APIView):
    permission_classes = [IsAuditor]
    forget = False

    def get(self, request: Request) -> Response:
        if not self.forget:
            self.authorize(request)
        return Response({"secret": "only for auditors"})


def _get(view, roles: tuple[str, ...]):
    request = APIRequestFactory().get("/probe")
    force_authenticate(request, user=Principal(user_id="probe", client_id=None, roles=roles))
    return view(request)


def test_a_view_that_never_authorizes_answers_nothing() -> None:
    """A handler that forgets self.authorize() is a programming error: it fails instead of answering."""
    assert _get(_Audited.as_view(), ("auditor",)).status_code == 200
    assert _get(_Audited.as_view(), ("user",)).status_code == 403
    with pytest.raises(RuntimeError, match="without authorize"):
        _get(_Audited.as_view(forget=True), ("auditor",))

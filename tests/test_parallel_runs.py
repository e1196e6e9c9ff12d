"""What keeps pytest-xdist's worker processes apart (config/settings/test.py, tests/conftest.py)."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from config.settings.test import valkey_database_url, xdist_valkey_databases
from tests import file_order
from tests.conftest import pytest_xdist_node_collection_finished


@pytest.mark.parametrize("workers", range(1, 8))
def test_each_xdist_worker_has_valkey_databases_no_other_worker_uses(workers: int) -> None:
    layouts = [xdist_valkey_databases(worker, workers) for worker in range(workers)]
    own = [database for database, _ in layouts]
    brokers = [database for _, share in layouts for database in share]
    assert all(len(share) >= 1 for _, share in layouts)
    assert len(set(own) | set(brokers)) == len(own) + len(brokers)  # no database twice
    assert set(own) <= set(range(1, 8)), own  # 0 is a run in one process's
    assert set(brokers) <= set(range(8, 16)), brokers  # the 16 a Valkey has


def test_more_xdist_workers_than_valkey_databases_are_refused() -> None:
    with pytest.raises(ImproperlyConfigured, match="at most 7"):
        xdist_valkey_databases(7, 8)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://:secret@127.0.0.1:6379/0", "redis://:secret@127.0.0.1:6379/3"),
        ("redis://valkey:6379", "redis://valkey:6379/3"),
        ("rediss://valkey:6380/12?ssl_cert_reqs=none", "rediss://valkey:6380/3?ssl_cert_reqs=none"),
    ],
)
def test_a_valkey_url_gets_the_database_asked_for(url: str, expected: str) -> None:
    assert valkey_database_url(url, 3) == expected


def test_this_process_uses_its_own_layout() -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        own, brokers = int(urlsplit(settings.REDIS_URL).path.strip("/") or 0), range(8, 16)
        assert settings.SSE_REDIS_PREFIX == "sse:"
    else:
        own, brokers = xdist_valkey_databases(
            int(worker.removeprefix("gw")), int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
        )
        assert settings.SSE_REDIS_PREFIX == f"sse-{worker}:"
    for url in [settings.REDIS_URL, settings.CELERY_BROKER_URL, *settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"]]:
        assert urlsplit(url).path == f"/{own}", url
    assert [urlsplit(url).path for url in settings.TEST_CELERY_BROKER_URLS] == [f"/{database}" for database in brokers]
    assert {urlsplit(url).netloc for url in settings.TEST_CELERY_BROKER_URLS} == {urlsplit(settings.REDIS_URL).netloc}


def test_a_node_id_shared_by_several_tests_stops_an_xdist_run() -> None:
    """xdist schedules by node id: of tests sharing one it runs one and reports the others nowhere."""
    pytest_xdist_node_collection_finished(None, ["t.py::a[1]", "t.py::a[2]", "t.py::b"])
    with pytest.raises(pytest.exit.Exception, match=r"1 node ids .* e\.g\. t\.py::a$"):
        pytest_xdist_node_collection_finished(None, ["t.py::a", "t.py::a", "t.py::b"])


class FakeItem:
    def __init__(self, nodeid: str, *markers: str) -> None:
        self.nodeid, self.markers = nodeid, markers

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.markers else None


def test_files_of_expensive_tests_are_handed_out_first_and_cheap_files_last() -> None:
    """xdist's own order (most tests first) ended a run with a minute of model tests on one worker."""
    items = [FakeItem(f"tests/many.py::t{index}") for index in range(30)]
    items += [FakeItem("tests/model.py::a", "model"), FakeItem("tests/model.py::b", "model")]
    items += [FakeItem("tests/live.py::a", "live"), FakeItem("tests/few.py::a")]
    file_order.pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    assert [item.nodeid for item in items][:4] == [
        "tests/model.py::a",
        "tests/model.py::b",
        "tests/live.py::a",
        "tests/many.py::t0",
    ]
    assert items[-1].nodeid == "tests/few.py::a"


def test_xdist_keeps_the_order_of_the_files(request: pytest.FixtureRequest) -> None:
    assert getattr(request.config.option, "loadscopereorder", False) is False

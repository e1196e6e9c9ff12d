"""apps.retrieval.leases: work leases held by a database session, gone when the session ends."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from django.db import connection

from apps.retrieval import leases
from tests.conftest import wait_until_released

pytestmark = pytest.mark.django_db

KIND = 0x74657374  # "test": apart from the real kinds


@pytest.fixture
def other_session():
    connection.ensure_connection()
    session = psycopg.connect(**connection.get_connection_params(), autocommit=True)
    yield session
    session.close()


def test_lock_key_is_a_signed_int4():
    assert leases.lock_key(uuid.UUID(int=0x7FFFFFFF)) == 0x7FFFFFFF
    assert leases.lock_key(uuid.UUID(int=0xFFFFFFFF)) == -1
    assert leases.lock_key(uuid.UUID(int=(5 << 64) | 7)) == 7
    assert leases.lock_key(2**40 + 3) == 3


def test_first_free_ids_in_order_up_to_the_limit(other_session):
    ids = [uuid.uuid4() for _ in range(6)]
    assert leases.try_take(KIND, ids[1:3], cursor=other_session.cursor()) == ids[1:3]
    mine = leases.try_take(KIND, ids, limit=3)
    assert mine == [ids[0], ids[3], ids[4]]
    # What was not kept is not held either: the other session can take it.
    assert leases.try_take(KIND, [ids[5]], cursor=other_session.cursor()) == [ids[5]]
    leases.release(KIND, mine)
    assert leases.try_take(KIND, mine, cursor=other_session.cursor()) == mine


def test_ids_sharing_a_key_are_claimed_once():
    first = uuid.UUID(int=(1 << 64) | 42)
    twin = uuid.UUID(int=(2 << 64) | 42)
    assert leases.try_take(KIND, [first, twin]) == [first]
    leases.release(KIND, [first])
    assert leases.held_by_others(KIND) == 0


def test_leases_end_with_the_session_and_kinds_are_separate(other_session):
    ids = [uuid.uuid4() for _ in range(3)]
    assert leases.try_take(KIND, ids, cursor=other_session.cursor()) == ids
    assert leases.held_by_others(KIND) == 3
    assert leases.try_take(KIND + 1, ids) == ids  # another kind of work: no conflict
    leases.release(KIND + 1, ids)
    assert leases.try_take(KIND, ids) == []
    other_session.close()
    wait_until_released(KIND)
    with leases.leased(KIND, ids, limit=2) as mine:
        assert mine == ids[:2]
    assert leases.try_take(KIND, ids) == ids  # released on the way out of the block
    leases.release(KIND, ids)

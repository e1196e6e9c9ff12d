"""config.wsgi_bridge.LifoThreadPool: the thread that went idle last takes the next job; never more threads than
allowed; jobs beyond them wait in arrival order; results, errors, cancellation and shutdown as an Executor's."""

from __future__ import annotations

import threading
import time

import pytest

from config.wsgi_bridge import CoalescingWSGIMiddleware, LifoThreadPool


def _thread_name() -> str:
    return threading.current_thread().name


def _warm(pool: LifoThreadPool, count: int) -> list[str]:
    """Make ``count`` threads exist (all busy at once), then idle; the names in the order they went idle."""
    gate = threading.Barrier(count + 1)
    order: list[str] = []
    lock = threading.Lock()
    released = [threading.Event() for _ in range(count)]

    def job(i: int) -> None:
        gate.wait(timeout=5)
        released[i].wait(timeout=5)
        with lock:
            order.append(_thread_name())

    futures = [pool.submit(job, i) for i in range(count)]
    gate.wait(timeout=5)
    for i in range(count):  # one at a time: each goes idle before the next is let go
        released[i].set()
        futures[i].result(timeout=5)
        time.sleep(0.02)
    return order


def test_the_most_recently_idle_thread_takes_the_next_job() -> None:
    pool = LifoThreadPool(8, thread_name_prefix="T")
    order = _warm(pool, 4)
    assert len(set(order)) == 4
    last = order[-1]
    # One job at a time: always the same, most recently idle thread, never a round of all four.
    assert {pool.submit(_thread_name).result(timeout=5) for _ in range(20)} == {last}
    pool.shutdown()


def test_never_more_threads_than_allowed_and_the_backlog_runs_in_order() -> None:
    pool = LifoThreadPool(2, thread_name_prefix="B")
    hold = threading.Event()
    busy = [pool.submit(hold.wait, 5) for _ in range(2)]
    ran: list[int] = []
    names: set[str] = set()

    def record(i: int) -> None:
        ran.append(i)
        names.add(_thread_name())

    queued = [pool.submit(record, i) for i in range(5)]
    time.sleep(0.05)
    assert ran == []  # both threads busy: nothing else started
    hold.set()
    for future in busy + queued:
        future.result(timeout=5)
    assert sorted(ran) == [0, 1, 2, 3, 4]
    assert names <= {"B_0", "B_1"}
    assert len([t for t in threading.enumerate() if t.name.startswith("B_")]) == 2
    pool.shutdown()


def test_results_errors_and_cancellation_are_the_callers() -> None:
    pool = LifoThreadPool(1)
    assert pool.submit(lambda a, b=0: a + b, 40, b=2).result(timeout=5) == 42
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(timeout=5)
    hold = threading.Event()
    busy = pool.submit(hold.wait, 5)
    order: list[int] = []
    in_order = [pool.submit(order.append, i) for i in range(5)]  # one thread: the backlog in arrival order
    ran = threading.Event()
    queued = pool.submit(ran.set)
    assert queued.cancel()  # still waiting for the one thread: cancellable, and then never run
    hold.set()
    busy.result(timeout=5)
    for future in in_order:
        future.result(timeout=5)
    assert order == [0, 1, 2, 3, 4]
    assert pool.submit(lambda: "after").result(timeout=5) == "after"
    assert not ran.is_set()
    pool.shutdown()


def test_shutdown_ends_idle_threads_and_refuses_new_jobs() -> None:
    pool = LifoThreadPool(3, thread_name_prefix="S")
    _warm(pool, 3)
    pool.shutdown()
    deadline = time.monotonic() + 5
    while any(t.name.startswith("S_") for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.name.startswith("S_") for t in threading.enumerate())
    with pytest.raises(RuntimeError):
        pool.submit(_thread_name)


def test_the_bridge_runs_requests_on_it() -> None:
    assert isinstance(CoalescingWSGIMiddleware(lambda environ, start_response: [], workers=4).executor, LifoThreadPool)

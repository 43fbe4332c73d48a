"""Property checks run their targets and references single-threaded by default, and restore the
process's thread settings afterwards."""

import threading

import pytest
import torch
from threadpoolctl import threadpool_info

from gramcheck import api, threads
from gramcheck.variants import get


def _blas_threads():
    return {p["filepath"]: p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"}


@pytest.fixture
def two_threads():
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(old)


def test_limited_sets_and_restores(two_threads):
    before = _blas_threads()
    with threads.limited(1) as n:
        assert n == 1 and torch.get_num_threads() == 1
        assert all(c == 1 for c in _blas_threads().values())
    assert torch.get_num_threads() == 2 and _blas_threads() == before


def test_zero_leaves_settings_alone(two_threads):
    with threads.limited(0) as n:
        assert n == 0 and torch.get_num_threads() == 2


def test_environment_and_validation(monkeypatch):
    monkeypatch.setenv(threads.ENV, "3")
    assert threads.resolve() == 3 and threads.resolve(2) == 2
    monkeypatch.delenv(threads.ENV)
    assert threads.resolve() == 1
    monkeypatch.setenv(threads.ENV, "two")
    with pytest.raises(ValueError, match="GRAMCHECK_THREADS"):
        threads.resolve()
    with pytest.raises(ValueError, match="threads: got -1"):
        threads.resolve(-1)


def test_pinned_reaches_a_worker_that_already_ran_torch(two_threads):
    """A limit set in the caller does not reach a thread whose torch state already exists: pinned does."""
    import queue

    jobs, seen = queue.Queue(), {}

    def worker():
        while (job := jobs.get()) is not None:
            name, fn = job
            seen[name] = fn()
            jobs.task_done()

    t = threading.Thread(target=worker)
    t.start()
    jobs.put(("start", lambda: torch.ones(4).sum() and torch.get_num_threads()))  # this thread's count: 2
    jobs.join()
    with threads.limited(1):
        jobs.put(("plain", torch.get_num_threads))
        jobs.put(("pinned", threads.pinned(torch.get_num_threads, 1)))
        jobs.put(("after", torch.get_num_threads))
        jobs.put(None)
        t.join()
    del seen["start"]
    assert seen == {"plain": 2, "pinned": 1, "after": 2}


def test_check_runs_the_target_single_threaded(two_threads):
    counts = []
    lin = get("linear-elu")

    def target(q, k, v, *, causal):
        counts.append(torch.get_num_threads())
        return lin.torch(q, k, v, causal=causal, form="chunked", chunk_size=4)

    report = api.check(target, "linear-elu", causal=True, properties=["causality"], domain={"examples": 3})
    assert report.findings and counts and set(counts) == {1}
    assert torch.get_num_threads() == 2
    counts.clear()
    api.check(target, "linear-elu", causal=True, properties=["causality"], domain={"examples": 3}, threads=2)
    assert counts and set(counts) == {2}

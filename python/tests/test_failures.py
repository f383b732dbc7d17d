"""A torch job that goes wrong fails on every rank within seconds, with torch's
DistBackendError carrying ringccl's message: which rank, which peer, which calls."""

import pytest

from conftest import launch


@pytest.mark.parametrize("mode", ["shape_mismatch", "dtype_mismatch", "async_failure"])
def test_a_mismatch_raises_on_every_rank_naming_both_calls(mode):
    ranks = launch(2, "failures.py", mode)
    assert ranks.ok(), ranks.report()
    for rank, res in enumerate(ranks.results()):
        assert res["error"], f"rank {rank} raised nothing:\n{ranks.report()}"
        assert res["type"] == "DistBackendError", res
        # Within seconds, not at the 20 s deadline.
        assert res["seconds"] < 10, res
        message = res["error"]
        assert "all_reduce" in message, message
        assert "rank" in message, message
    # Both shapes (or types) appear in what the ranks were told.
    text = " ".join(r["error"] for r in ranks.results())
    if mode == "shape_mismatch":
        assert "1000" in text and "1001" in text, text
    if mode == "dtype_mismatch":
        assert "f32" in text and "i32" in text, text


def test_a_killed_rank_is_named_by_the_others_within_the_deadline():
    ranks = launch(3, "failures.py", "killed_rank", kill=(2, "READY"))
    results = ranks.results()
    for rank in (0, 1):
        res = results[rank]
        assert res is not None and res["error"], f"rank {rank}:\n{ranks.report()}"
        assert res["type"] == "DistBackendError", res
        assert res["seconds"] < 25, res  # the group's deadline is 20 s
        assert "rank 2" in res["error"], res["error"]


def test_monitored_barrier_names_the_rank_that_did_not_come():
    ranks = launch(3, "failures.py", "monitored_barrier")
    assert ranks.ok(), ranks.report()
    results = ranks.results()
    first = results[0]
    assert first["error"] and "rank(s) 1 did not reach the barrier" in first["error"], first
    assert first["seconds"] < 4, first  # rank 0 gave up after its 2 s
    late = results[1]
    assert late["error"] and "rank 0 reported" in late["error"], late

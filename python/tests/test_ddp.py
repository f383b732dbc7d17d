"""torch's DistributedDataParallel on ringccl gives gloo's parameters, in every mode DDP
users reach for."""

import pytest

from conftest import launch

VARIANTS = ["plain", "no_sync", "find_unused", "bucket_view", "static_graph", "fp16_hook"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_ddp_matches_gloo(variant):
    ranks = launch(2, "ddp.py", variant)
    assert ranks.ok(), ranks.report()
    for rank, res in enumerate(ranks.results()):
        assert res["same_everywhere"], f"rank {rank}: ranks hold different parameters"
        # Two ranks: a sum of two addends is the same whichever order adds them, so the
        # parameters are bit-identical to gloo's.
        assert res["bit_identical"], f"rank {rank}: differs from gloo by {res['max_diff']}"
        print(f"{variant}: rank {rank} bit-identical to gloo")


def test_ddp_three_ranks_matches_gloo_within_rounding():
    ranks = launch(3, "ddp.py", "find_unused")
    assert ranks.ok(), ranks.report()
    for rank, res in enumerate(ranks.results()):
        assert res["same_everywhere"]
        assert res["max_diff"] < 1e-5, res
        print(f"3 ranks: rank {rank} bit-identical={res['bit_identical']} max diff {res['max_diff']:.2e}")

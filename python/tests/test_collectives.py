"""Every collective x element type x operator through torch.distributed, on 2 and 3
ranks, against exact references and gloo; results bit-identical on every rank."""

import pytest

from conftest import launch


@pytest.mark.parametrize("n", [2, 3])
def test_every_collective_matches_the_reference_and_gloo(n):
    ranks = launch(n, "collectives.py")
    results = ranks.results()
    assert ranks.ok(), ranks.report()
    for rank, res in enumerate(results):
        assert res is not None, f"rank {rank} printed no result:\n{ranks.report()}"
        assert res["failures"] == [], res["failures"]
        assert res["checked"] > 500, res


@pytest.mark.parametrize("n", [2, 3])
def test_batch_isend_irecv_exchanges_and_rings_of_large_tensors(n):
    ranks = launch(n, "p2p_batch.py")
    assert ranks.ok(), ranks.report()
    for res in ranks.results():
        assert res["ok"], res["detail"]

"""layout="auto": CSR where the measured crossover says it is faster, dense elsewhere."""

from __future__ import annotations

import pytest
import torch
from sparse_helpers import assert_close

import fprune
from fprune import _torch
from fprune.sparse import _auto, crossover, layouts, to_sparse


def _layer(out_features, in_features, amount, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(out_features, in_features, generator=g).to(dtype)
    keep = fprune.l1_unstructured({"w": w.float()}, amount)["w"]
    return {"w": w}, {"w": keep}


def test_crossover_is_the_highest_over_rows_unless_rows_is_given():
    for threads, table in _auto.CROSSOVER.items():
        assert crossover(threads) == max(table.values())
        for rows, value in table.items():
            assert crossover(threads, rows) >= value
    assert crossover(1, 10**6) == _auto.CROSSOVER[1][max(_auto.CROSSOVER[1])]
    assert crossover(64) == crossover(max(_auto.CROSSOVER))  # more threads than measured


@pytest.mark.parametrize("amount", [0.5, 0.75, 0.9, 0.95, 0.98, 0.995])
def test_auto_follows_the_crossover(amount):
    params, masks = _layer(1024, 1024, amount)
    got = layouts(to_sparse(params, masks))["w"]
    assert got == ("csr" if amount >= crossover() - 1e-4 else "dense")


def test_rows_chooses_for_that_size():
    lowest_rows = min(_auto.CROSSOVER[1], key=lambda r: _auto.CROSSOVER[1][r])
    amount = _auto.CROSSOVER[1][lowest_rows]
    params, masks = _layer(1024, 1024, amount)
    with _threads(1):
        assert layouts(to_sparse(params, masks, rows=lowest_rows))["w"] == "csr"


def test_small_layers_other_dtypes_and_unmasked_weights_stay_dense():
    params, masks = _layer(64, 64, 0.99)  # below MIN_WEIGHTS
    assert layouts(to_sparse(params, masks))["w"] == "dense"
    params, masks = _layer(1024, 1024, 0.99, torch.bfloat16)  # no CPU sparse kernel
    assert layouts(to_sparse(params, masks))["w"] == "dense"
    params, _ = _layer(1024, 1024, 0.99)
    assert layouts(to_sparse(params, {}))["w"] == "dense"
    assert to_sparse(params, {})["w"] is params["w"]


def test_auto_keeps_weights_on_other_devices_dense():
    params, masks = _layer(1024, 1024, 0.99)
    meta = {"w": params["w"].to("meta")}
    assert layouts(to_sparse(meta, {"w": masks["w"].to("meta")}))["w"] == "dense"


def test_without_wrapper_subclasses_every_weight_stays_dense_and_right(monkeypatch):
    params, masks = _layer(512, 512, 0.99)
    monkeypatch.setattr(_torch, "_MAKE_WRAPPER_SUBCLASS", None)
    assert not _torch.has_wrapper_subclasses()
    with pytest.warns(UserWarning, match="cannot make the tensor subclass"):
        sparse = to_sparse(params, masks, layout="csr")
    assert type(sparse["w"]) is torch.Tensor
    x = torch.randn(3, 512)
    assert_close(torch.nn.functional.linear(x, sparse["w"]), x @ (params["w"] * masks["w"]).t())


class _threads:
    def __init__(self, n):
        self.n = n

    def __enter__(self):
        self.saved = torch.get_num_threads()
        torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        torch.set_num_threads(self.saved)

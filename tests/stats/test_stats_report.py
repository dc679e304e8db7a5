"""fprune.report: the per-layer sparsity table, differentially against counts written here."""

import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import fprune
from fprune.select import LayerCollapseWarning


@st.composite
def mask_trees(draw):
    tree = {}
    for name in draw(
        st.lists(
            st.sampled_from(["a.weight", "a.bias", "b.weight", "c"]), min_size=0, max_size=4, unique=True
        )
    ):
        shape = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=3)))
        n = int(torch.Size(shape).numel())
        tree[name] = torch.tensor(
            draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=torch.bool
        ).reshape(shape)
    return tree


@given(mask_trees(), st.booleans())
def test_rows_and_total_count_what_the_masks_hold(masks, only_weights):
    where = (lambda name, m: name.endswith("weight")) if only_weights else None
    rep = fprune.report(masks, where=where)
    picked = sorted(k for k in masks if where is None or where(k, masks[k]))
    assert [r.name for r in rep.rows] == picked
    for row in rep.rows:
        m = masks[row.name]
        assert row.shape == tuple(m.shape) and row.kept == int(m.sum()) and row.pruned == int((~m).sum())
        assert row.sparsity == (row.pruned / m.numel() if m.numel() else 0.0)
    assert rep.total.kept == sum(int(masks[k].sum()) for k in picked)
    assert rep.total.pruned == sum(int((~masks[k]).sum()) for k in picked)
    if where is None and masks:
        assert abs(rep.total.sparsity - float(fprune.sparsity(masks).overall)) < 1e-12
    assert len(str(rep).splitlines()) == len(picked) + 3
    assert rep.to_dicts()[-1]["name"] == "total" and len(rep.to_dicts()) == len(picked) + 1


def test_table_format_nested_names_and_float_masks():
    masks = {
        "enc": {"w": torch.tensor([[1.0, 0.0], [0.0, 0.0]])},
        "head": [torch.tensor([True, True, False])],
    }
    text = str(fprune.report(masks))
    assert text.splitlines() == [
        "| parameter | shape | kept | pruned | sparsity |",
        "|---|---|---:|---:|---:|",
        "| enc.w | (2, 2) | 1 | 3 | 75.00% |",
        "| head.0 | (3,) | 2 | 1 | 33.33% |",
        "| **total** | 7 entries | 3 | 4 | 57.14% |",
    ]


def test_report_of_real_masks_and_empty_selection():
    params = {"fc.weight": torch.randn(10, 10), "fc.bias": torch.randn(10)}
    masks = fprune.global_unstructured(params, 0.5, where=lambda n, p: n.endswith("weight"))
    rep = fprune.report(masks, where=lambda n, m: n.endswith("weight"))
    assert rep.total.pruned == 50 and rep.total.sparsity == 0.5 and rep.rows[0].shape == (10, 10)
    none = fprune.report(masks, where=lambda n, m: False)
    assert none.rows == [] and none.total.numel == 0 and none.total.sparsity == 0.0


def test_report_and_sparsity_take_packed_masks():
    # report and sparsity take packed masks, as apply_masks does, with the same results.
    masks = fprune.l1_unstructured({"w": torch.randn(4, 6), "b": torch.randn(3)}, 0.5)
    packed = fprune.pack_masks(masks)
    assert str(fprune.report(packed)) == str(fprune.report(masks))
    got, expected = fprune.sparsity(packed), fprune.sparsity(masks)
    assert float(got.overall) == float(expected.overall) == 14 / 27  # 12 of 24, 2 of 3
    assert all(torch.equal(got.per_leaf[k], expected.per_leaf[k]) for k in masks)


@given(mask_trees(), st.integers(0, 3), st.booleans())
def test_batched_report_is_the_report_of_each_member(masks, members, only_weights):
    # A batched tree (every leaf stacked along a new first dim) reports as its members one by one.
    g = torch.Generator().manual_seed(members)
    stacked = {k: torch.rand((members, *m.shape), generator=g) > 0.5 for k, m in masks.items()}
    where = (lambda name, m: name.endswith("weight")) if only_weights else None
    got = fprune.batched_report(stacked, where=where)
    assert len(got) == (members if stacked else 0)
    for b, rep in enumerate(got):
        expected = fprune.report({k: m[b] for k, m in stacked.items()}, where=where)
        assert rep == expected
        assert rep.collapsed == [r.name for r in expected.rows if r.numel and r.kept == 0]


def test_batched_report_names_the_layers_a_vmap_over_levels_collapses():
    # Under vmap the global selection cannot read its counts, so it cannot warn; the eager call
    # at each level warns with LayerCollapseWarning. batched_report names the same layers.
    g = torch.Generator().manual_seed(0)
    params = {
        "0.weight": torch.randn(32, 16, generator=g),
        "1.weight": 0.01 * torch.randn(4, 32, generator=g),  # small weights: the first to go
        "1.bias": torch.randn(4, generator=g),
    }
    weights = lambda name, p: p.dim() > 1
    levels = torch.tensor([0.05, 0.15, 0.9, 0.95])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning under vmap: the batched result is silent
        per_level = torch.vmap(lambda a: fprune.global_unstructured(params, a, where=weights))(levels)
    got = [r.collapsed for r in fprune.batched_report(per_level, where=weights)]
    expected = []
    for level in levels.tolist():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fprune.global_unstructured(params, level, where=weights)
        collapse = [w for w in caught if issubclass(w.category, LayerCollapseWarning)]
        expected.append(["1.weight"] if collapse and "1.weight" in str(collapse[0].message) else [])
    assert got == expected == [[], [], ["1.weight"], ["1.weight"]]
    text = str(fprune.batched_report(per_level)[2])
    assert "| 1.weight | (4, 32) | 0 | 128 | 100.00% |" in text.splitlines()


def test_batched_report_checks_the_batch_dim():
    with pytest.raises(ValueError, match=r"batch dim first.*masks\['b'\] of shape \(\)"):
        fprune.batched_report({"a": torch.ones(2, 3) > 0, "b": torch.tensor(True)})
    with pytest.raises(ValueError, match=r"share their first dim.*'a': \(2, 3\).*'b': \(3,\)"):
        fprune.batched_report({"a": torch.ones(2, 3) > 0, "b": torch.ones(3) > 0})

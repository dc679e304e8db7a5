"""The selection engine's histograms (index_add_ into reused buffers, windows sized to the sample's
spread): the masks of the plain reference (a stable sort), whatever the thread count and window."""

import torch
from hypothesis import given
from hypothesis import strategies as st

from fprune.select import _engine, _histogram
from tests.engine.engine_helpers import (
    CPU,
    owner,
    reference,
    sources_of,
)


@given(st.integers(0, 2**31 - 1), st.sampled_from(["radix", "sampled"]), st.integers(1, 3))
def test_histograms_give_the_reference_masks_at_any_thread_count(seed, path, threads):
    before = torch.get_num_threads()
    patched = {"CHUNK": 64, "SAMPLED": 1 if path == "sampled" else 1 << 30}
    saved = {name: getattr(owner(name), name) for name in patched}
    try:
        torch.set_num_threads(threads)
        for name, value in patched.items():
            setattr(owner(name), name, value)
        g = torch.Generator().manual_seed(seed)
        # a few hundred distinct values: ties to split, keys close enough for narrow windows
        scores = [torch.randint(-300, 300, (n,), generator=g).float() / 7 for n in (150, 90, 400)]
        keeps = [None, torch.rand(90, generator=g) < 0.7, None]
        k = int(torch.randint(0, 641, (1,), generator=g))
        for transform in (None, _engine.MAGNITUDE):
            expected = reference(scores, keeps, k, transform)
            got = _engine.prune_lowest(sources_of(scores, keeps, transform), k, traced=False, device=CPU)
            assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
            each = _engine.prune_lowest_each(
                sources_of(scores, keeps, transform), [k // 3] * 3, traced=False, device=CPU
            )
            for i, mask in enumerate(each):
                (alone,) = reference([scores[i]], [keeps[i]], k // 3, transform)
                assert torch.equal(mask, alone)
    finally:
        torch.set_num_threads(before)
        for name, value in saved.items():
            setattr(owner(name), name, value)


def test_a_narrow_sample_spread_gets_a_narrow_window(monkeypatch):
    """Values a few ulps apart: the window is sized to the sample's spread, not to the maximum."""
    monkeypatch.setattr(owner("SAMPLED"), "SAMPLED", 1)
    widths = []
    original = _histogram._histogram

    def recorded(stream, low, shift, next_shift):
        widths.append(shift - next_shift)
        return original(stream, low, shift, next_shift)

    monkeypatch.setattr(owner("_histogram"), "_histogram", recorded)
    values = (1.0 + torch.randint(0, 50, (100_000,)).double() * 2.0**-23).float()  # > CANDIDATES
    k = 37_000
    got = _engine.prune_lowest(sources_of([values], [None], None), k, traced=False, device=CPU)
    assert torch.equal(got[0], reference([values], [None], k, None)[0])
    assert widths == [_histogram._MIN_WINDOW_BITS]  # one histogram, of the narrowest window

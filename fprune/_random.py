"""Private: the sources of randomness of the random pruning methods.

``generator`` may be ``None`` (torch's global generator, as torch.nn.utils.prune uses), a
``torch.Generator``, or a seed: an int or an integer tensor. A seed drives a stateless,
counter-based hash of (seed, leaf number, entry index), so it needs no state at all: it is
reproducible on every device, traceable by ``torch.compile``, and under ``vmap`` a batched seed
gives every member its own masks.
"""

from __future__ import annotations

import hashlib
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import torch

from fprune import _torch
from fprune._types import GeneratorLike

#: :data:`fprune._types.GeneratorLike` (the mask functions that take a ``generator`` spell it so).
Generator = GeneratorLike

_M32 = (1 << 32) - 1


def check_generator(generator: GeneratorLike) -> GeneratorLike:
    """Validate ``generator``; returns it unchanged."""
    if generator is None or isinstance(generator, torch.Generator):
        return generator
    if isinstance(generator, torch.Tensor):
        if generator.dtype.is_floating_point or generator.dtype in (torch.bool,) or generator.is_complex():
            raise TypeError(
                f"Expected generator to be None, a torch.Generator, or an integer seed; got a "
                f"tensor of dtype {generator.dtype}."
            )
        if generator.dim() != 0:
            raise ValueError(
                f"Expected a seed tensor given as generator to be 0-dim (use vmap to batch "
                f"seeds), got shape {tuple(generator.shape)}."
            )
        return generator
    if isinstance(generator, numbers.Integral) and not isinstance(generator, bool):
        if not -(2**63) <= generator < 2**63:
            raise ValueError(
                f"Expected an integer seed given as generator to fit in int64, "
                f"[-2**63, 2**63 - 1], got {generator}."
            )
        return generator
    raise TypeError(
        f"Expected generator to be None, a torch.Generator, or an integer seed; got {generator!r}."
    )


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (two multiply-xorshift rounds) of int64 ``x`` in ``[0, 2**32)``.

    Computed in int64 without overflow: ``x < 2**32`` and the multiplier ``< 2**27``, so every
    product fits. The pruners hash their seed with the step with it.
    """
    x = x ^ (x >> 16)
    x = (x * 0x45D9F3B) & _M32
    x = x ^ (x >> 16)
    x = (x * 0x45D9F3B) & _M32
    return x ^ (x >> 16)


def mix32_int(x: int) -> int:
    """:func:`mix32` of a Python int."""
    x ^= x >> 16
    x = (x * 0x45D9F3B) & _M32
    x ^= x >> 16
    x = (x * 0x45D9F3B) & _M32
    return x ^ (x >> 16)


def uniform(
    shape: Sequence[int], generator: GeneratorLike, stream: int, device: torch.device
) -> torch.Tensor:
    """Uniform random scores in [0, 1) of ``shape``; ``stream`` (the leaf number) separates leaves.

    With a seed, the values are float64 multiples of 2**-32 drawn from the hash; otherwise float32
    values from ``torch.rand``. On a device without float64 (MPS, see
    :func:`fprune._torch.has_float64`) a seed gives the hash's 32-bit integers themselves (int64
    ``2**32`` times the float64 values): the same order, so the same masks, with no float64.
    """
    if generator is None:
        return torch.rand(shape, device=device)
    if isinstance(generator, torch.Generator):
        if generator.device.type != torch.device(device).type:
            raise ValueError(
                f"Expected generator on the params' device ({device}), got a torch.Generator on "
                f"{generator.device} for leaf number {stream}; make it with "
                f"torch.Generator(device=...) or pass an integer seed (device-independent)."
            )
        return torch.rand(shape, generator=generator, device=device)
    numel = 1
    for size in shape:
        numel *= size
    index = torch.arange(numel, device=device, dtype=torch.int64)
    return uniform_at(index, generator, stream).reshape(shape)


def uniform_at(positions: torch.Tensor, seed: int | torch.Tensor, stream: int) -> torch.Tensor:
    """The seeded draws of :func:`uniform` at flat (row-major) ``positions`` of the full shape.

    ``uniform(shape, seed, stream, device).reshape(-1)[positions]``, computed for those
    positions only (the hash of each position): a process holding one shard of a tensor draws
    its own entries (``positions``: int64, on the device of the draws).
    """
    device = positions.device
    key: Any
    if isinstance(seed, torch.Tensor):
        key = seed.to(device=device, dtype=torch.int64) & _M32
        base: Any = mix32(key ^ ((stream * 0x9E3779B9) & _M32))
    else:  # a Python int: the same hash in Python, no host-to-device copy
        key = int(seed) & _M32
        base = mix32_int(key ^ ((stream * 0x9E3779B9) & _M32))
    bits = mix32(mix32((positions + base) & _M32) ^ key)
    if not _torch.has_float64(device):
        return bits
    return bits.to(torch.float64) * 2.0**-32


def describe(generator: GeneratorLike) -> str:
    """What two processes must agree on to draw the same numbers: the seed, or a hash of the
    state of the generator (``None``: torch's global generator). Reads the state (eager code)."""
    if generator is None:
        generator = torch.default_generator
    if isinstance(generator, torch.Generator):
        state = generator.get_state()
        return "state:" + hashlib.blake2b(state.numpy().tobytes(), digest_size=8).hexdigest()
    return f"seed:{int(generator)}"


class Draws:
    """The draws of the random methods as a score function of :func:`fprune.select.select_inputs`.

    ``draws(i)`` is leaf ``i``'s draws, ``uniform(shape(i), generator, i, device(i))``; the two
    optional members of a score function are there too: ``draws.at(i, positions)`` (the draws at
    given flat positions: a seed hashes only those, a generator draws the leaf and indexes it)
    and ``draws.fingerprint()`` (:func:`describe` of the generator).
    """

    def __init__(self, generator: GeneratorLike, shape: Callable[[int], Any], device: Callable[[int], Any]):
        self.generator = generator
        self.shape = shape
        self.device = device

    def __call__(self, i: int) -> torch.Tensor:
        return uniform(self.shape(i), self.generator, i, self.device(i))

    def at(self, i: int, positions: torch.Tensor) -> torch.Tensor:
        if self.generator is None or isinstance(self.generator, torch.Generator):
            return self(i).reshape(-1)[positions.to(self.device(i))]
        return uniform_at(positions, self.generator, i)

    def fingerprint(self) -> str:
        return describe(self.generator)

"""Private: the sources of randomness of the random pruning methods.

``generator`` may be ``None`` (torch's global generator, as torch.nn.utils.prune uses), a
``torch.Generator``, or a seed: an int or an integer tensor. A seed drives a stateless,
counter-based hash of (seed, leaf number, entry index), so it needs no state at all: it is
reproducible on every device, traceable by ``torch.compile``, and under ``vmap`` a batched seed
gives every member its own masks.
"""

from __future__ import annotations

import numbers
from typing import Union

import torch

from fprune import _torch

Generator = Union[None, torch.Generator, int, torch.Tensor]

_M32 = (1 << 32) - 1


def check_generator(generator: Generator) -> Generator:
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
        f"Expected generator to be None, a torch.Generator, or an integer seed; got "
        f"{generator!r}."
    )


def _mix32(x: torch.Tensor) -> torch.Tensor:
    # A 32-bit integer hash (two multiply-xorshift rounds) computed in int64 without overflow:
    # x < 2**32 and the multiplier < 2**27, so every product fits.
    x = x ^ (x >> 16)
    x = (x * 0x45D9F3B) & _M32
    x = x ^ (x >> 16)
    x = (x * 0x45D9F3B) & _M32
    return x ^ (x >> 16)


def _mix32_int(x: int) -> int:
    """:func:`_mix32` of a Python int."""
    x ^= x >> 16
    x = (x * 0x45D9F3B) & _M32
    x ^= x >> 16
    x = (x * 0x45D9F3B) & _M32
    return x ^ (x >> 16)


def uniform(shape, generator: Generator, stream: int, device: torch.device) -> torch.Tensor:
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
    if isinstance(generator, torch.Tensor):
        seed = generator.to(device=device, dtype=torch.int64) & _M32
        base = _mix32(seed ^ ((stream * 0x9E3779B9) & _M32))
    else:  # a Python int: the same hash in Python, no host-to-device copy
        seed = int(generator) & _M32
        base = _mix32_int(seed ^ ((stream * 0x9E3779B9) & _M32))
    numel = 1
    for size in shape:
        numel *= size
    index = torch.arange(numel, device=device, dtype=torch.int64)
    bits = _mix32(_mix32((index + base) & _M32) ^ seed)
    if not _torch.has_float64(device):
        return bits.reshape(shape)
    return (bits.to(torch.float64) * 2.0**-32).reshape(shape)

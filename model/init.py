"""Seeded parameter initialisation: a tensor's initial values depend only on (seed, its name).

Every parameter (or variant stage) draws from its own CPU `torch.Generator`, seeded from a
hash of the model seed and the parameter's (or stage's) qualified name. So at one seed a
parameter that two variants share (same name, same shape) gets the same values whatever
else either variant constructs, and the variant's own parameters come from generators no
shared parameter uses. Values are drawn in float32 on the CPU and copied into the
parameter, so they are also the same on every device and dtype. Meta tensors (used by
`model.counts.count_instantiated` and `Variant.contributions`) hold no values and are skipped.
"""

from __future__ import annotations

import hashlib

import torch
from torch.overrides import TorchFunctionMode


def seeded_generator(seed: int, name: str) -> torch.Generator:
    """CPU generator seeded with the first 63 bits of SHA-256(f"{seed}/{name}")."""
    digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


@torch.no_grad()
def normal_(p: torch.Tensor, std: float, generator: torch.Generator | None = None) -> None:
    """Fill p in place with N(0, std^2) draws from generator (None: torch's global CPU RNG)."""
    if not p.is_meta:
        p.copy_(torch.empty(p.shape, dtype=torch.float32).normal_(0.0, std, generator=generator))


@torch.no_grad()
def uniform_(p: torch.Tensor, bound: float, generator: torch.Generator | None = None) -> None:
    """Fill p in place with U(-bound, bound) draws from generator (None: the global CPU RNG)."""
    if not p.is_meta:
        p.copy_(torch.empty(p.shape, dtype=torch.float32).uniform_(-bound, bound, generator=generator))


class NoInitOnMeta(TorchFunctionMode):
    """Skip in-place initialisers (nn.init.normal_, Tensor.uniform_, ...) on meta tensors:
    they hold no values, and torch routes them through Python decompositions whose first
    call imports torch._dynamo (seconds). Used to count a model without allocating it."""

    _INIT = {
        "normal_",
        "uniform_",
        "fill_",
        "zero_",
        "ones_",
        "zeros_",
        "constant_",
        "kaiming_uniform_",
        "kaiming_normal_",
        "xavier_uniform_",
        "xavier_normal_",
        "trunc_normal_",
    }

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", None) in self._INIT:
            target = args[0] if args else kwargs.get("tensor")  # nn.init passes tensor=
            if isinstance(target, torch.Tensor) and target.is_meta:
                return target
        return func(*args, **kwargs)

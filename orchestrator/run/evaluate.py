"""Validation sums a worker (or the final-weights check) adds across ranks before dividing.

Kept apart from the training loop so the weights check reads validation exactly as training
does without importing the worker.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch


@torch.no_grad()
def eval_sums(
    model: Callable[..., Any],
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    device: torch.device,
    autocast: AbstractContextManager[Any] | None = None,
    accuracy: bool = False,
) -> list[float]:
    """[loss sum (nats), labelled positions, correct predictions] of ``model`` over ``batches``.

    ``model(x, y)`` returns (logits [B, T, V], loss) with loss the mean cross-entropy over the
    positions where y != -100 (``model.gpt.GPT``: ``F.cross_entropy(..., ignore_index=-100)``),
    so each batch's loss is weighted by its labelled count; a batch with none (all padding rows,
    loss NaN) adds nothing. ``correct`` (argmax = target on labelled positions,
    ``model.metrics.token_accuracy``) is computed only when ``accuracy``, else 0. Sums, not
    means, so ranks add them before dividing once (``val_metrics``)."""
    from model.metrics import token_accuracy

    total = count = correct = 0.0
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        with autocast or nullcontext():
            logits, loss = model(x, y)
        n = float((y != -100).sum())
        if n:
            total += float(loss) * n
            count += n
            correct += float(token_accuracy(logits, y)[0]) if accuracy else 0.0
    return [total, count, correct]


def val_metrics(sums: list[float], labelled: bool) -> tuple[float, float | None]:
    """(mean loss in nats per labelled position, accuracy) from ``eval_sums`` totals; the
    accuracy (fraction of labelled positions predicted right) only for a ``labelled`` corpus
    (MQAR), else None. A pass with nothing labelled gives (NaN, None): not logged."""
    total, count, correct = sums
    if not count:
        return math.nan, None
    return total / count, correct / count if labelled else None

"""Evaluation metrics on model outputs: pure PyTorch, single device, no distributed code.

Each metric returns sums (not means) as tensors on the input's device, so a caller adds them over
batches and all-reduces them over ranks before dividing once: the result is then the same for any
batching or number of workers.
"""

from __future__ import annotations

import torch


def token_accuracy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> tuple[torch.Tensor, torch.Tensor]:
    """(correct, count): labelled positions whose argmax prediction equals the target, and the
    number of labelled positions; int64 scalar tensors on logits' device.

    logits: [B, T, V] (any float dtype); targets: int [B, T], ``ignore_index`` marks unscored
    positions (as in torch's cross_entropy; MQAR labels only the query keys). Accuracy over a
    set of batches is sum(correct) / sum(count); count 0 means nothing was labelled. Ties in the
    argmax go to the lowest token id (torch.argmax). Computes no gradient and needs no host sync.
    Raises ValueError when the shapes do not match.
    """
    if logits.dim() != 3 or targets.shape != logits.shape[:2]:
        raise ValueError(
            f"token_accuracy: logits must be [B, T, V] and targets [B, T], got {tuple(logits.shape)} and {tuple(targets.shape)}"
        )
    with torch.no_grad():
        labelled = targets != ignore_index
        hits = (logits.argmax(dim=-1) == targets) & labelled
        return hits.sum(), labelled.sum()

"""Shared helpers for the model tests."""

from __future__ import annotations

import pytest
import torch

from model import GPT, build_config

VOCAB = 97  # small, odd-sized vocabulary keeps tests fast and catches shape mix-ups


@pytest.fixture
def make_model():
    """make_model(variant, scale="cpu-xs", seed=0, **options) -> GPT in float32, eval mode."""

    def _make(variant: str, scale: str = "cpu-xs", seed: int = 0, seq_len: int = 32, **options) -> GPT:
        torch.manual_seed(seed)
        model = GPT(build_config(scale, variant, vocab_size=VOCAB, seq_len=seq_len, **options), seed=seed)
        return model.eval()

    return _make

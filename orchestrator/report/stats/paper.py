"""Reference numbers from the paper (arXiv 2604.01683), printed beside the study's own.

Source: DESIGN.md "The science being orchestrated". All perplexities are WikiText-103
validation perplexity; the paper's 60M/150M/350M labels are nominal model sizes (the paper
does not say whether embeddings are counted), so the scaling plot draws them on their own
panel instead of on our non-embedding N axis.
"""

from __future__ import annotations

import re

# scale label -> variant -> (low, high) perplexity; a single number has low == high.
PAPER_PPL: dict[str, dict[str, tuple[float, float]]] = {
    "60m": {"standard": (24.22, 24.22), "coupled": (22.55, 22.62), "uncoupled_mlp": (23.81, 23.81)},
    "150m": {"standard": (21.57, 21.57), "coupled": (20.12, 20.12)},
    "350m": {"standard": (19.55, 19.55), "coupled": (19.35, 19.35), "differential": (18.93, 18.93)},
}
PAPER_NOMINAL_N: dict[str, float] = {"60m": 60e6, "150m": 150e6, "350m": 350e6}
# Seed standard deviation of final perplexity (coupled vs uncoupled MLP).
PAPER_SEED_STD: dict[str, float] = {"coupled": 0.04, "uncoupled_mlp": 0.31}
# Compute-matched: standard needs this many times the tokens to match coupled.
PAPER_TOKEN_RATIO = 2.4

_ALIASES = {
    "standard": "standard",
    "sdpa": "standard",
    "coupled": "coupled",
    "uncoupledmlp": "uncoupled_mlp",
    "uncoupled": "uncoupled_mlp",
    "mlp": "uncoupled_mlp",
    "differential": "differential",
    "diff": "differential",
    "diffattn": "differential",
}


def paper_variant(variant: str) -> str | None:
    """Map a study's variant name to the paper's variant key, or None if the paper has none.

    Names are compared lowercase without separators, so "uncoupled-mlp" and "uncoupled_mlp"
    match; "coupled_differential" (beyond the paper) maps to None.
    """
    key = re.sub(r"[^a-z0-9]", "", variant.lower())
    return _ALIASES.get(key)


def paper_scale(scale: str) -> str | None:
    """Map a scale label like "60m" or "60M" to the paper's scale key, or None."""
    key = re.sub(r"[^a-z0-9]", "", scale.lower())
    return key if key in PAPER_PPL else None


def paper_ppl(scale: str, variant: str) -> tuple[float, float] | None:
    """The paper's (low, high) WikiText-103 perplexity for this scale and variant, or None."""
    s, v = paper_scale(scale), paper_variant(variant)
    if s is None or v is None:
        return None
    return PAPER_PPL[s].get(v)

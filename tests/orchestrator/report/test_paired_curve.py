"""The seed-paired Δ loss curve (paired_curve.py) and its figure, on studies with a known answer.

The stores here are in memory (finals and metrics frames as curves.run_finals and
query_study give them), so each test states its truth exactly: the variant's loss is the
reference's law plus a known Δ, each run carries a large offset shared by the runs of its
seed (what pairing cancels) and each eval point its own small noise.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from orchestrator.report import plots
from orchestrator.report.stats.paired_curve import COLUMNS, FINAL, INTERPOLATED, SAME_STEP, paired_curves
from orchestrator.report.stats.verdict import paired_differences

SCALES = ("xs", "s")
STEPS = np.arange(1, 21) * 100_000.0  # the reference's eval steps (tokens)


def reference_loss(t: np.ndarray, scale: str) -> np.ndarray:
    """The reference's val loss (nats/token) at t tokens: a falling power law, lower at the larger scale."""
    return 2.0 + (5.0 if scale == "xs" else 4.0) * t ** (-0.3)


def _frames(dloss: float, var_steps: np.ndarray = STEPS, seeds=(0, 1, 2), noise: float = 0.004, rng_seed: int = 0):
    """(finals, metrics) of one planned run per scale, arm and seed; the variant's loss is the
    reference's plus `dloss` at every t, read at its own eval steps `var_steps`."""
    rng = np.random.default_rng(rng_seed)
    finals, metrics = [], []
    for scale in SCALES:
        for seed in seeds:
            shared = rng.normal(0.0, 0.05)  # the seed's luck, common to both arms
            for variant, steps, shift in (("standard", STEPS, 0.0), ("coupled", var_steps, dloss)):
                rid = f"{variant}-{scale}-{seed}"
                loss = reference_loss(steps, scale) + shift + shared + rng.normal(0.0, noise, len(steps))
                metrics.append(pd.DataFrame({"run_uuid": rid, "key": "val/ppl", "step": steps.astype(np.int64), "value": np.exp(loss)}))
                finals.append(
                    {
                        "run_uuid": rid,
                        "scale": scale,
                        "variant": variant,
                        "seed": seed,
                        "extend": 1.0,
                        "complete": True,
                        "status": "finished",
                        "tokens": float(steps[-1]),
                        "final_ppl": float(np.exp(loss[-1] + rng.normal(0.0, noise))),
                        "corpus": "synthetic",
                    }
                )
    return pd.DataFrame(finals), pd.concat(metrics, ignore_index=True)


def _curve(finals: pd.DataFrame, metrics: pd.DataFrame) -> pd.DataFrame:
    return paired_curves(finals, metrics, list(SCALES), ["standard", "coupled"], "standard")


def _coverage(dloss: float, var_steps: np.ndarray = STEPS, replicates: int = 10) -> tuple[float, float]:
    """Over `replicates` stores with fresh noise: the fraction of eval-point intervals covering
    the true `dloss` (95% intervals: expect about 0.95) and the mean error of the estimate (nats)."""
    ev = pd.concat([_curve(*_frames(dloss, var_steps, rng_seed=100 + r)) for r in range(replicates)])
    ev = ev[ev["point"] == "eval"]
    return float(((ev["low"] <= dloss) & (dloss <= ev["high"])).mean()), float((ev["dloss"] - dloss).mean())


def test_a_known_gap_is_recovered_at_every_eval_point_and_its_intervals_cover_it():
    out = _curve(*_frames(dloss=-0.05))
    assert list(out.columns) == COLUMNS
    ev = out[out["point"] == "eval"]
    assert len(ev) == 2 * len(STEPS) and set(ev["read"]) == {SAME_STEP} and set(ev["n_pairs"]) == {3}
    assert set(ev["corpus"]) == {"synthetic"} and set(ev["variant"]) == {"coupled"}
    assert np.abs(ev["dloss"] - -0.05).max() < 0.015  # the shared 0.05-sd seed luck is paired away
    covered, bias = _coverage(-0.05)
    assert covered >= 0.9 and abs(bias) < 0.002, (covered, bias)
    assert (ev["high"] < 0).all()  # a 0.05-nat gap against 0.004-nat noise: every point resolves it
    for scale in SCALES:
        assert list(ev.loc[ev["scale"] == scale, "tokens"]) == list(STEPS)


def test_no_gap_gives_intervals_that_include_zero():
    out = _curve(*_frames(dloss=0.0, rng_seed=1))
    ev = out[out["point"] == "eval"]
    assert np.abs(ev["dloss"]).max() < 0.015
    covered, bias = _coverage(0.0)
    assert covered >= 0.9 and abs(bias) < 0.002, (covered, bias)
    fin = out[out["point"] == "final"]
    assert len(fin) == 2 and ((fin["low"] <= 0) & (0 <= fin["high"])).all()


def test_a_flop_matched_arm_reads_the_reference_interpolated_in_log_tokens_never_extrapolated():
    var_steps = STEPS * 0.8  # fewer tokens per eval: steps between the reference's, the first before its first
    out = _curve(*_frames(dloss=-0.05, var_steps=var_steps))
    ev = out[out["point"] == "eval"]
    assert ev["tokens"].min() >= STEPS[0] and len(ev) == 2 * (len(STEPS) - 1)  # 80k precedes the reference's 100k: dropped
    on_grid = np.isin(ev["tokens"], STEPS)
    assert set(ev.loc[on_grid, "read"]) == {SAME_STEP} and set(ev.loc[~on_grid, "read"]) == {INTERPOLATED}
    assert on_grid.sum() == 2 * 4  # 400k, 800k, 1.2M, 1.6M
    assert np.abs(ev["dloss"] - -0.05).max() < 0.015  # the interpolation of a smooth curve costs < 1e-3 nats here
    covered, bias = _coverage(-0.05, var_steps)
    assert covered >= 0.9 and abs(bias) < 0.002, (covered, bias)
    fin = out[out["point"] == "final"]
    assert list(fin["tokens"]) == [var_steps[-1]] * 2  # the final pass sits at the variant's planned tokens


def test_the_final_point_is_the_verdict_tables_paired_difference():
    finals, metrics = _frames(dloss=-0.05)
    out = _curve(finals, metrics).set_index(["scale", "point"])
    table = paired_differences(finals, list(SCALES), ["standard", "coupled"], "standard").set_index("scale")
    for scale in SCALES:
        row, want = out.loc[(scale, "final")], table.loc[scale]
        assert row["n_pairs"] == want["n_pairs"] and row["read"] == FINAL
        for got, exp in (("dloss", "paired_dloss"), ("low", "paired_low"), ("high", "paired_high"), ("p_value", "p_value")):
            assert row[got] == pytest.approx(want[exp], rel=1e-12), (scale, got)


def test_unpaired_seeds_and_one_seed():
    finals, metrics = _frames(dloss=-0.05)
    drop = finals["run_uuid"] == "standard-xs-2"  # seed 2 of the reference at xs is missing: two pairs there
    out = _curve(finals[~drop], metrics)
    assert set(out.loc[out["scale"] == "xs", "n_pairs"]) == {2} and set(out.loc[out["scale"] == "s", "n_pairs"]) == {3}
    one = _curve(*_frames(dloss=-0.05, seeds=(0,)))
    assert set(one["n_pairs"]) == {1} and one["low"].isna().all() and one["high"].isna().all()
    assert one["dloss"].notna().all()


def test_nothing_to_pair_is_an_empty_frame_and_no_figure(tmp_path):
    finals, metrics = _frames(dloss=-0.05)
    alone = finals[finals["variant"] == "standard"]
    out = paired_curves(alone, metrics, list(SCALES), ["standard"], "standard")
    assert out.empty and list(out.columns) == COLUMNS
    assert plots.paired_dloss(out, plots.colors(["standard"]), "standard", tmp_path / "f.png") is None


def test_the_figure_has_one_labelled_panel_per_scale_and_corpus_with_n(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    finals, metrics = _frames(dloss=-0.05)
    drop = finals["run_uuid"] == "standard-xs-2"
    data = _curve(finals[~drop], metrics)
    seen: dict[str, Any] = {}
    save = Figure.savefig

    def spy(fig, fname, *a, **k):
        save(fig, fname, *a, **k)
        seen["axes"] = [(ax.get_title(), ax.get_xlabel(), ax.get_ylabel(), [t.get_text() for t in ax.texts]) for ax in fig.axes]
        (legend,) = fig.legends  # one legend for every panel
        seen["legend"] = ([t.get_text() for t in legend.get_texts()], legend.get_title().get_text())

    monkeypatch.setattr(Figure, "savefig", spy)
    path = plots.paired_dloss(data, plots.colors(["standard", "coupled"]), "standard", tmp_path / "paired_dloss_vs_tokens.png")
    assert path is not None and path.stat().st_size > 10_000
    (t_xs, xlabel, ylabel, n_xs), (t_s, _, _, n_s) = seen["axes"]
    assert "scale xs" in t_xs and "corpus synthetic" in t_xs and "scale s" in t_s
    assert "tokens" in xlabel and "Δ val loss" in ylabel and "variant − reference" in ylabel
    assert n_xs == ["n = 2 seed pairs"] and n_s == ["n = 3 seed pairs"]  # seed 2's reference is missing at xs
    labels, title = seen["legend"]
    assert labels == ["coupled − standard", "final pass at the planned budget (verdict table)"]
    assert "95% paired t interval" in title


def test_one_seed_pair_draws_points_and_says_there_is_no_interval(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    seen = {}
    save = Figure.savefig

    def spy(fig, fname, *a, **k):
        save(fig, fname, *a, **k)
        seen["title"] = fig.legends[0].get_title().get_text()

    monkeypatch.setattr(Figure, "savefig", spy)
    data = _curve(*_frames(dloss=-0.05, seeds=(0,)))
    assert plots.paired_dloss(data, plots.colors(["standard", "coupled"]), "standard", tmp_path / "one.png") is not None
    assert "no interval" in seen["title"]

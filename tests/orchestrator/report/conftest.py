"""One real MLflow SQLite store per test session holding every synthetic study the tests read."""

from __future__ import annotations

import pytest

from orchestrator.report.synthetic import SyntheticStudy, write_synthetic_study

# Baseline needs exactly 2.4x the tokens of coupled; uncoupled_mlp needs 4x (> the x3 extend
# range, so censored); seed noise 0.002 nats ~ the paper's 0.04 ppl seed std at ppl 22.
MAIN = SyntheticStudy(
    study="ratio",
    variants={"standard": 1.0, "coupled": 2.4, "uncoupled_mlp": 4.0},
    scales={"xs": 2e6, "s": 8e6, "m": 3.2e7},
    seeds=(0, 1, 2),
    extend=(1.5, 2.0, 3.0),
    seed_noise={"standard": 0.002, "coupled": 0.002, "uncoupled_mlp": 0.014},
    failed=(("coupled", "s", 2, 1.0),),
    skip=(("standard", "m", 1, 2.0),),
    rng_seed=7,
)
ONE_SEED = SyntheticStudy(study="one-seed", scales={"xs": 2e6}, seeds=(0,), n_eval=8)
# Five scales: enough for a 3-parameter scaling law (three are refused).
FIVE_SCALES = SyntheticStudy(study="five-scales", scales={"s1": 1e6, "s2": 3e6, "s3": 1e7, "s4": 3e7, "s5": 1e8},
                             seeds=(0, 1), extend=(2.0,), n_eval=5)
NO_EXTEND = SyntheticStudy(study="no-extend", scales={"xs": 2e6}, seeds=(0, 1), extend=(), n_eval=8)


@pytest.fixture(scope="session")
def store(tmp_path_factory):
    """sqlite tracking URI with every study above written through MLflow."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    for spec in (MAIN, ONE_SEED, NO_EXTEND, ALL_FAILED, FIVE_SCALES):
        write_synthetic_study(spec, uri)
    return uri


@pytest.fixture(scope="session")
def main_report(store, tmp_path_factory):
    """build_report of MAIN (logged to MLflow), with its output folder."""
    from orchestrator.report import build_report

    out = tmp_path_factory.mktemp("report") / "ratio"
    summary = build_report(MAIN.study, store, out, n_boot=400)
    return summary, out
# Nothing finished: every run failed half-way (partial curves, no final metrics).
ALL_FAILED = SyntheticStudy(
    study="all-failed", scales={"xs": 2e6}, seeds=(0,), extend=(2.0,), n_eval=6,
    failed=(("standard", "xs", 0, 1.0), ("standard", "xs", 0, 2.0), ("coupled", "xs", 0, 1.0)),
)

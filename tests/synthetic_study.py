"""Synthetic studies with known answers, written into a real MLflow store (or kept in memory).

The tests (and the report benchmark, ``benchmarks.report``) need runs whose token ratio is
known exactly. The loss of a run of variant v, non-embedding size N, trained for D planned
tokens, is a Chinchilla-style law (Hoffmann et al. 2022, eq. 2) with a per-variant token
efficiency k_v:

    L(N, D) = E + A * N^(-alpha) + B * (k_v * D)^(-beta)

so the reference variant (k = 1) needs exactly k_v times the tokens to reach variant v's
final loss: the true token ratio is k_v / k_ref. Seed noise is a constant offset per run:
Normal(0, seed_noise[v]) of its own plus, with seed_shared > 0, Normal(0, seed_shared) shared
by every run of one (scale, seed), as runs that share data order and initial weights share
their luck (the pairing the report uses). Intermediate eval points carry an extra
(1 - t/D) * schedule_gap term, the not-yet-annealed learning rate, which vanishes at t = D.
Runs follow the training side's MLflow convention (README.md, "Conventions the numbers depend
on"); with `accuracy` set they also log MQAR's `val/accuracy` and `final/val_accuracy`.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

E, A, ALPHA, B, BETA = 2.0, 100.0, 0.34, 100.0, 0.28
TS0 = 1_700_000_000_000  # ms: the synthetic runs' first timestamp
RunKey = tuple[str, str, int, float]  # (variant, scale, seed, extend)


@dataclass
class SyntheticStudy:
    """What to write. Scales map label -> non-embedding N; variants map name -> k_v."""

    study: str = "synthetic"
    variants: dict[str, float] = field(default_factory=lambda: {"standard": 1.0, "coupled": 2.4})
    scales: dict[str, float] = field(default_factory=lambda: {"xs": 2e6, "s": 8e6, "m": 3.2e7})
    seeds: tuple[int, ...] = (0, 1, 2)
    extend: tuple[float, ...] = (1.5, 2.0, 3.0)
    reference: str = "standard"
    tokens_per_param: float = 20.0
    n_eval: int = 20
    seed_noise: dict[str, float] = field(default_factory=dict)  # loss units; default 0.002
    seed_shared: float = 0.0  # loss units: offset shared by the runs of one (scale, seed)
    schedule_gap: float = 0.03
    failed: tuple[RunKey, ...] = ()
    skip: tuple[RunKey, ...] = ()
    rng_seed: int = 1234
    corpus: str = "synthetic"
    accuracy: dict[str, float] = field(default_factory=dict)  # variant -> final MQAR accuracy
    accuracy_noise: float = 0.01
    # variant -> FLOPs per token over 6N (default 1.0011 for non-reference variants, 1 for the reference)
    flops_factor: dict[str, float] = field(default_factory=dict)
    budget_mode: str = "tokens"  # "flops": a variant trains the reference's FLOPs, tokens / its factor

    def fpt(self, variant: str, n: float) -> float:
        """FLOPs per token of `variant` at non-embedding size n."""
        return 6.0 * n * self.flops_factor.get(variant, 1.0 if variant == self.reference else 1.0011)

    def planned_tokens(self, variant: str, n: float, mult: float) -> float:
        """Planned tokens of a run: tokens_per_param N x mult, FLOP-matched when budget_mode is flops."""
        d = self.tokens_per_param * n * mult
        return float(round(d * self.fpt(self.reference, n) / self.fpt(variant, n) if self.budget_mode == "flops" else d))

    def planned(self) -> list[RunKey]:
        """Every (variant, scale, seed, extend) the study plans, extend runs for the reference only."""
        out = []
        for scale in self.scales:
            for variant in self.variants:
                mults = (1.0, *self.extend) if variant == self.reference else (1.0,)
                out += [(variant, scale, seed, m) for m in mults for seed in self.seeds]
        return out

    def true_ratio(self, variant: str) -> float:
        """The exact tokens the reference needs to match `variant`, divided by variant's tokens."""
        return self.variants[variant] / self.variants[self.reference]


def loss_at(study: SyntheticStudy, variant: str, n: float, tokens: np.ndarray, planned: float, offset: float):
    """Eval loss (nats/token) at `tokens` seen for a run planned for `planned` tokens."""
    k = study.variants[variant]
    final = E + A * n ** (-ALPHA) + B * (k * tokens) ** (-BETA)
    return final + offset + study.schedule_gap * (1.0 - tokens / planned)


def _offsets(study: SyntheticStudy) -> dict[RunKey, float]:
    """Each planned run's seed offset (nats). The own part is drawn in plan order from
    rng_seed (as before seed_shared existed, so older stores keep their numbers); the shared
    part from a second stream."""
    rng = np.random.default_rng(study.rng_seed)
    own = {key: rng.normal(0.0, study.seed_noise.get(key[0], 0.002)) for key in study.planned()}
    if study.seed_shared <= 0:
        return own
    shared_rng = np.random.default_rng([study.rng_seed, 1])
    shared = {(s, sd): shared_rng.normal(0.0, study.seed_shared) for s in study.scales for sd in study.seeds}
    return {key: v + shared[(key[1], key[2])] for key, v in own.items()}


def finals_frame(study: SyntheticStudy, rng: np.random.Generator, scales: list[str] | None = None) -> pd.DataFrame:
    """Per-run finals as curves.run_finals gives them, drawn in memory (no MLflow): the same law
    and noise model as the written store, fresh noise from `rng`. For simulations that call
    token_ratio thousands of times (tests/orchestrator/report/test_coverage.py).

    Columns: scale, variant, seed, extend, tokens, final_ppl, complete, flops_per_token, final_wall_s.
    """
    keys = [k for k in study.planned() if scales is None or k[1] in scales]
    variant, scale, seed, mult = (np.array(c) for c in zip(*keys))
    n = np.array([study.scales[s] for s in scale])
    k = np.array([study.variants[v] for v in variant])
    d = study.tokens_per_param * n * mult.astype(float)
    own = np.array([study.seed_noise.get(v, 0.002) for v in variant]) * rng.standard_normal(len(keys))
    cells = sorted({(s, sd) for s, sd in zip(scale, seed)})
    shared = dict(zip(cells, rng.normal(0.0, study.seed_shared, len(cells)) if study.seed_shared > 0 else np.zeros(len(cells))))
    loss = E + A * n ** (-ALPHA) + B * (k * d) ** (-BETA) + own + np.array([shared[c] for c in zip(scale, seed)])
    return pd.DataFrame(
        {
            "scale": scale,
            "variant": variant,
            "seed": seed,
            "extend": mult.astype(float),
            "tokens": d,
            "final_ppl": np.exp(loss),
            "complete": True,
            "flops_per_token": 6.0 * n,
            "final_wall_s": d / 1e5,
        }
    )


def _fmt(m: float) -> str:
    return f"{m:g}"


def write_synthetic_study(study: SyntheticStudy, tracking_uri: str, *, bulk_sql: bool = False) -> list[str]:
    """Create the study's experiment and runs in MLflow; returns the MLflow run ids.

    bulk_sql=True inserts the metric rows straight into MLflow's `metrics`/`latest_metrics`
    tables with one executemany per run (same rows log_batch would write, ~50x faster; only for
    sqlite/postgres URIs) so the 1,000-run benchmark store builds in minutes, not an hour.
    """
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(study.study)  # several corpora share one experiment
    eid = exp.experiment_id if exp is not None else client.create_experiment(study.study)
    offsets = _offsets(study)
    acc_rng = np.random.default_rng([study.rng_seed, 2])
    run_ids: list[str] = []
    pending_rows: list[tuple] = []
    for key in study.planned():
        if key in set(study.skip):
            continue
        rid, rows = _write_run(client, eid, study, key, offsets[key], acc_rng)
        run_ids.append(rid)
        if bulk_sql:
            pending_rows += [(rid, k, v, TS0 + st // 1000, st) for k, v, st in rows]
        else:
            _log_metrics(client, rid, rows)
        client.set_terminated(rid, status="FAILED" if key in set(study.failed) else "FINISHED")
    if bulk_sql and pending_rows:
        _insert_metrics(tracking_uri, pending_rows)
    return run_ids


def _write_run(client, eid: str, study: SyntheticStudy, key: RunKey, offset: float, acc_rng) -> tuple[str, list[tuple]]:
    """Create one run with its tags and params; returns (run id, its metric rows)."""
    from mlflow.entities import Param

    variant, scale, seed, mult = key
    n = study.scales[scale]
    planned = study.planned_tokens(variant, n, mult)
    is_failed = key in set(study.failed)
    fpt = study.fpt(variant, n)
    name = f"{variant}-{scale}-s{seed}-x{_fmt(mult)}"
    tags = {
        "study": study.study,
        "run_id": uuid.uuid5(uuid.NAMESPACE_URL, f"{study.study}/{study.corpus}/{name}").hex[:16],
        "variant": variant,
        "scale": scale,
        "seed": str(seed),
        "corpus": study.corpus,
        "extend": _fmt(mult),
        "status": "failed" if is_failed else "finished",
        "qkstudy.kind": "train",
    }
    if is_failed:
        tags["failure_reason"] = "synthetic failure: loss became NaN"
    rid = client.create_run(eid, run_name=name, tags=tags).info.run_id
    params = {
        "n_params": str(int(n)),
        "n_params_total": str(int(n * 1.3)),
        "flops_per_token": repr(fpt),
        "planned_tokens": str(int(planned)),
        "seq_len": "256",
        "global_batch": "32",
        "variant": variant,
    }
    client.log_batch(rid, params=[Param(k, v) for k, v in params.items()])
    acc = study.accuracy.get(variant)
    final_acc = None if acc is None else float(np.clip(acc + acc_rng.normal(0.0, study.accuracy_noise), 0.0, 1.0))
    return rid, _metric_rows(study, key, planned, fpt, offset, is_failed, final_acc)


def _metric_rows(
    study: SyntheticStudy, key: RunKey, planned: float, fpt: float, offset: float, is_failed: bool, final_acc: float | None
) -> list[tuple[str, float, int]]:
    """(metric, value, step) rows of one run: eval curves, and the final pass unless it failed."""
    variant, scale, _, _ = key
    n = study.scales[scale]
    other = variant != study.reference
    tps = 1e5 * (1e7 / n) * study.variants[study.reference] / (1.1 if other else 1.0)
    steps = np.unique(np.round(np.linspace(planned / study.n_eval, planned, study.n_eval)).astype(np.int64))
    if is_failed:
        steps = steps[: max(1, len(steps) // 2)]
    loss = loss_at(study, variant, n, steps.astype(float), planned, offset)
    rows: list[tuple[str, float, int]] = []
    for i, step in enumerate(steps):
        s, frac = int(step), step / planned
        rows += [
            ("val/loss", float(loss[i]), s),
            ("val/ppl", math.exp(loss[i]), s),
            ("train/loss", float(loss[i]) + 0.05, s),
            ("tokens", float(s), s),
            ("flops", s * fpt, s),
            ("time/wall_s", float(step / tps), s),
            ("attn/entropy", 3.0 - 0.5 * frac - (0.2 if other else 0.0), s),
            ("attn/effective_rank", 20.0 + 10.0 * frac + (5.0 if other else 0.0), s),
        ]
        if final_acc is not None:
            rows.append(("val/accuracy", float(final_acc * frac), s))
    if not is_failed:
        last = int(steps[-1])
        rows += [("final/val_loss", float(loss[-1]), last), ("final/val_ppl", math.exp(loss[-1]), last)]
        if final_acc is not None:
            rows.append(("final/val_accuracy", final_acc, last))
    return rows


def _log_metrics(client, rid: str, rows: list[tuple[str, float, int]]) -> None:
    from mlflow.entities import Metric

    metrics = [Metric(k, v, TS0 + st // 1000, st) for k, v, st in rows]
    for i in range(0, len(metrics), 1000):
        client.log_batch(rid, metrics=metrics[i : i + 1000])


def _insert_metrics(tracking_uri: str, rows: list[tuple]) -> None:
    """Insert (run_uuid, key, value, timestamp, step) rows into MLflow's metric tables."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(tracking_uri)
    latest: dict[tuple[str, str], tuple] = {}
    for r in rows:
        cur = latest.get((r[0], r[1]))
        if cur is None or (r[4], r[3]) >= (cur[4], cur[3]):
            latest[(r[0], r[1])] = r
    cols = "(run_uuid, key, value, timestamp, step, is_nan) VALUES (:r, :k, :v, :t, :s, :n)"

    def params(rs):
        return [{"r": r, "k": k, "v": v, "t": t, "s": s, "n": False} for r, k, v, t, s in rs]

    with engine.begin() as conn:
        conn.execute(sqlalchemy.text(f"INSERT INTO metrics {cols}"), params(rows))
        conn.execute(sqlalchemy.text(f"INSERT INTO latest_metrics {cols}"), params(latest.values()))
    engine.dispose()

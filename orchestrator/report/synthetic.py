"""Synthetic studies with known answers, written into a real MLflow store.

The tests and the benchmark need MLflow runs whose token ratio is known exactly. The loss
of a run of variant v, non-embedding size N, trained for D planned tokens, is a
Chinchilla-style law (Hoffmann et al. 2022, eq. 2) with a per-variant token efficiency k_v:

    L(N, D) = E + A * N^(-alpha) + B * (k_v * D)^(-beta)

so the reference variant (k = 1) needs exactly k_v times the tokens to reach variant v's
final loss: the true token ratio is k_v / k_ref. Each seed adds a constant offset
~ Normal(0, seed_noise[v]) to the run's loss; intermediate eval points carry an extra
(1 - t/D) * schedule_gap term, the not-yet-annealed learning rate, which vanishes at t = D.
Runs follow the training side's MLflow convention (DESIGN.md "Conventions").
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field

import numpy as np

E, A, ALPHA, B, BETA = 2.0, 100.0, 0.34, 100.0, 0.28


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
    schedule_gap: float = 0.03
    failed: tuple[tuple[str, str, int, float], ...] = ()  # (variant, scale, seed, extend)
    skip: tuple[tuple[str, str, int, float], ...] = ()
    rng_seed: int = 1234
    corpus: str = "synthetic"

    def planned(self) -> list[tuple[str, str, int, float]]:
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


def _fmt(m: float) -> str:
    return f"{m:g}"


def write_synthetic_study(study: SyntheticStudy, tracking_uri: str, *, bulk_sql: bool = False) -> list[str]:
    """Create the study's experiment and runs in MLflow; returns the MLflow run ids.

    bulk_sql=True inserts the metric rows straight into MLflow's `metrics`/`latest_metrics`
    tables with one executemany per run (same rows log_batch would write, ~50x faster; only for
    sqlite/postgres URIs) so the 1,000-run benchmark store builds in minutes, not an hour.
    """
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(study.study)  # several corpora share one experiment
    eid = exp.experiment_id if exp is not None else client.create_experiment(study.study)
    rng = np.random.default_rng(study.rng_seed)
    skip, failed = set(study.skip), set(study.failed)
    run_ids: list[str] = []
    pending_rows: list[tuple] = []
    for variant, scale, seed, mult in study.planned():
        offset = rng.normal(0.0, study.seed_noise.get(variant, 0.002))
        if (variant, scale, seed, mult) in skip:
            continue
        n = study.scales[scale]
        planned = float(round(study.tokens_per_param * n * mult))
        is_failed = (variant, scale, seed, mult) in failed
        fpt = 6.0 * n * (1.0011 if variant != study.reference else 1.0)
        tps = 1e5 * (1e7 / n) * study.variants[study.reference] / (1.1 if variant != study.reference else 1.0)
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
        run = client.create_run(eid, run_name=name, tags=tags)
        rid = run.info.run_id
        run_ids.append(rid)
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
        steps = np.unique(np.round(np.linspace(planned / study.n_eval, planned, study.n_eval)).astype(np.int64))
        if is_failed:
            steps = steps[: max(1, len(steps) // 2)]
        loss = loss_at(study, variant, n, steps.astype(float), planned, offset)
        wall = steps / tps
        rows: list[tuple[str, float, int]] = []
        for i, step in enumerate(steps):
            s = int(step)
            rows += [
                ("val/loss", float(loss[i]), s),
                ("val/ppl", math.exp(loss[i]), s),
                ("train/loss", float(loss[i]) + 0.05, s),
                ("tokens", float(s), s),
                ("flops", s * fpt, s),
                ("time/wall_s", float(wall[i]), s),
                ("attn/entropy", 3.0 - 0.5 * s / planned - (0.2 if variant != study.reference else 0.0), s),
                ("attn/effective_rank", 20.0 + 10.0 * s / planned + (5.0 if variant != study.reference else 0.0), s),
            ]
        if not is_failed:
            rows += [("final/val_loss", float(loss[-1]), int(steps[-1])), ("final/val_ppl", math.exp(loss[-1]), int(steps[-1]))]
        ts = 1_700_000_000_000
        if bulk_sql:
            pending_rows += [(rid, k, v, ts + st // 1000, st) for k, v, st in rows]
        else:
            metrics = [Metric(k, v, ts + st // 1000, st) for k, v, st in rows]
            for i in range(0, len(metrics), 1000):
                client.log_batch(rid, metrics=metrics[i : i + 1000])
        client.set_terminated(rid, status="FAILED" if is_failed else "FINISHED")
    if bulk_sql and pending_rows:
        _insert_metrics(tracking_uri, pending_rows)
    return run_ids


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

"""Steps at bare speed (`make bench`): the stack's optimizer steps against a
plain PyTorch loop of the same run.

    python -m benchmarks.bare_steps [--steps 120] [--repeats 2] [--scale cpu-xs]

For ZeRO stages 0 and 2 on CPU, interleaved ``--repeats`` times:
  - **stack**: one run through the product (local Ray, a Ray Train worker with 2 CPUs,
    DeepSpeed engine, the loader, MLflow logging, the grad norm); its tokens/s is the median of
    the run's ``throughput/tokens_per_s`` (wall-clock between log points, every 10 steps:
    logging and the loop included; the first point and the one spanning the mid-run eval
    left out by the median), and, beside it, its tokens over ``time/step_s`` (the optimizer
    steps alone, the worker's time split);
  - **bare**: the same model (same config and seed), batches (the same prepared data, loader
    and steps), AdamW with the same parameter groups, schedule and clipping, in this process
    with the same thread count: forward, backward, clip, step, one ``.item()`` per micro-batch
    as the worker does.
Both time every step (start-up, evaluation and checkpoints are outside the ratio; the time
split in the report has those). Goal: stack / bare >= 0.97. Appends a section to BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from orchestrator.plan.contract import RunSpec
from orchestrator.plan.planner import plan
from orchestrator.plan.spec import parse_spec


def bench_study(name: str, zero_stage: int, steps: int, scale: str) -> dict[str, Any]:
    """The one-run study the stack arm trains (cpu-xs by default, 8 x 128-token sequences)."""
    return {
        "name": name,
        "scales": [scale],
        "variants": ["standard"],
        "tokenizer": {"vocab_size": 2048},
        "budget": {"mode": "tokens", "tokens": steps * 8 * 128},
        "train": {"global_batch": 8, "seq_len": 128, "log_every_steps": 10},
        "eval": {"num_evals": 2, "max_windows": 8, "final_max_windows": 8, "diagnostics": False},
        "resources": {"workers": 1, "cpus_per_worker": 2, "zero_stage": zero_stage},
    }


def run_stack(study: dict[str, Any], root: Path) -> tuple[float, float, str, RunSpec]:
    """Train the study's one run through the product; (median logged tokens/s, tokens/s over
    its step seconds, the prepared data's path, the run). Raises RuntimeError when the run did
    not finish."""
    from mlflow.tracking import MlflowClient
    from rich.console import Console

    from orchestrator.run.driver.runner import run_runs
    from orchestrator.track.tracking import KIND_TAG, KIND_TRAIN, default_tracking_uri

    (run,) = plan(parse_spec(study))
    uri = default_tracking_uri(root / study["name"])
    run_runs([run], study["name"], uri, str(root / study["name"] / "ray"), console=Console(quiet=True))
    c = MlflowClient(uri)
    exp = c.get_experiment_by_name(study["name"])
    found = c.search_runs([exp.experiment_id], f"tags.`{KIND_TAG}` = '{KIND_TRAIN}'") if exp else []
    if len(found) != 1 or found[0].data.tags.get("qkstudy.status") != "finished":
        raise RuntimeError(f"steps benchmark: run of {study['name']} did not finish in {uri}")
    r = found[0]
    logged = [m.value for m in c.get_metric_history(r.info.run_id, "throughput/tokens_per_s")][1:]
    return statistics.median(logged), run.tokens / r.data.metrics["time/step_s"], r.data.params["data_path"], run


def run_bare(run: RunSpec, data_path: str, threads: int = 2, seed: int | None = None) -> tuple[float, list[float]]:
    """A plain PyTorch loop over the run's steps (module doc), timed per step: (tokens/s, the
    mean train loss [nats] of every step). ``seed`` overrides the run's model seed (the tests'
    negative control: other weights, other losses)."""
    from data_pipeline import TokenLoader
    from model import GPT, ModelConfig
    from orchestrator.run.worker.optim import batch_geometry, lr_multiplier, param_groups

    torch.set_num_threads(threads)
    t = run.train
    seed = run.seed if seed is None else seed
    torch.manual_seed(seed)
    model = GPT(ModelConfig(**run.model), seed=seed)
    loader = TokenLoader(data_path, "train", t.seq_len, t.global_batch, run.seed)
    opt = torch.optim.AdamW(param_groups(model, t.weight_decay), lr=t.lr, betas=t.betas, fused=False, foreach=True)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_multiplier(s, run.steps, t.warmup_steps, t.schedule, t.min_lr_ratio, t.decay_fraction)
    )
    geom = batch_geometry(t.global_batch, 1, t.micro_batch)
    model.train()
    step_s, losses = 0.0, []
    for step in range(run.steps):
        t0 = time.perf_counter()
        x, y = loader.xy(step, 0, 1)  # inside the clock, as in the worker's step
        micro = []
        for i in range(geom.grad_accum):
            xb, yb = x[i * geom.micro_batch : (i + 1) * geom.micro_batch], y[i * geom.micro_batch : (i + 1) * geom.micro_batch]
            _, loss = model(xb, yb)
            (loss / geom.grad_accum).backward()
            micro.append(loss.detach().item())
        float(torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip))
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        step_s += time.perf_counter() - t0
        losses.append(sum(micro) / len(micro))
    return run.tokens / step_s, losses


def bench_steps(steps: int = 120, repeats: int = 2, scale: str = "cpu-xs") -> list[dict[str, Any]]:
    """Per ZeRO stage: every repeat's stack and bare tokens/s and their medians' ratio."""
    import tempfile

    from benchmarks.training import local_ray

    rows = []
    with local_ray() as tmp:
        root = Path(tempfile.mkdtemp(prefix="steps-", dir=tmp))
        per: dict[int, dict[str, list[float]]] = {z: {"stack": [], "steps_only": [], "bare": []} for z in (0, 2)}
        for rep in range(repeats):
            for z in (0, 2):  # interleaved: stack then bare, per stage, per repeat
                tps, steps_tps, data_path, run = run_stack(bench_study(f"steps-z{z}-r{rep}", z, steps, scale), root)
                per[z]["stack"].append(tps)
                per[z]["steps_only"].append(steps_tps)
                per[z]["bare"].append(run_bare(run, data_path)[0])
        for z, v in per.items():
            s, b = statistics.median(v["stack"]), statistics.median(v["bare"])
            rows.append(
                {
                    "zero_stage": z,
                    **v,
                    "stack_tps": s,
                    "bare_tps": b,
                    "ratio": s / b,
                    "steps_only_ratio": statistics.median(v["steps_only"]) / b,
                }
            )
    return rows


def section(rows: list[dict[str, Any]], steps: int, repeats: int, scale: str, load: str) -> str:
    """The BENCHMARKS.md section of ``bench_steps``' rows."""
    from benchmarks.record import machine_description

    head = (
        f"\n## Steps at bare speed: the stack's optimizer steps vs a plain PyTorch loop ({scale}, "
        f"{steps} steps, 8 x 128 tokens, 2 CPU threads)\n\n{dt.date.today().isoformat()} - {machine_description()} - "
        f"load avg at start {load} - `python -m benchmarks.bare_steps --steps {steps} --repeats {repeats}`\n\n"
        "| ZeRO stage | stack tokens/s (each repeat) | bare tokens/s (each repeat) | stack / bare (medians) | "
        "stack steps alone / bare | goal |\n|---:|---|---|---:|---:|---:|\n"
    )

    def each(xs: list[float]) -> str:
        return ", ".join(f"{x:,.0f}" for x in xs)

    return head + "".join(
        f"| {r['zero_stage']} | {each(r['stack'])} | {each(r['bare'])} | {r['ratio']:.3f} | {r['steps_only_ratio']:.3f} | >= 0.97 |\n"
        for r in rows
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--scale", default="cpu-xs")
    ap.add_argument("--out", type=Path, default=Path("BENCHMARKS.md"))
    args = ap.parse_args(argv)
    from benchmarks.record import append_markdown

    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    text = section(bench_steps(args.steps, args.repeats, args.scale), args.steps, args.repeats, args.scale, load)
    print(text)
    append_markdown(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

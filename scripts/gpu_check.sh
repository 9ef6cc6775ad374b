#!/usr/bin/env bash
# The GPU numbers BENCHMARKS.md needs, in one short script:
#   1. benchmarks.model_steps at 60m and 150m: standard, coupled (the default QK implementation: compiled
#      on CUDA) and coupled:impl=eager, bf16 autocast, flash SDPA only; tokens/s, MFU against
#      the device's peak (orchestrator/run/worker/mfu.py), coupled/standard ratio (goal <= 1.05),
#      step memory. Tables go to $OUT/BENCHMARKS.gpu.md (append them to BENCHMARKS.md).
#   2. the short stack run jobs/gpu-smoke.yaml (standard vs coupled at 60m, one GPU, local Ray,
#      MLflow in runs/gpu-smoke/mlflow.db) and each run's throughput/tokens_per_s,
#      throughput/mfu and wall-clock ($OUT/stack.txt).
# About 5 minutes on one H100/H200 (compiles included).
#   scripts/gpu_check.sh            # on a GPU machine
#   scripts/gpu_check.sh --dry-run  # the same bench code path on CPU at tiny shapes, and the
#                                   # smoke spec validated (what the tests run)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/gpu-check}
mkdir -p "$OUT"

if [[ "${1:-}" == "--dry-run" ]]; then
    "$PY" -m benchmarks.model_steps --dry-run
    "$PY" -m orchestrator.cli validate jobs/gpu-smoke.yaml
    exit 0
fi

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
PEAK=$("$PY" -c "from orchestrator.run.worker.mfu import device_peak_flops as p; v = p(); print(v / 1e12 if v else '')")
echo "peak bf16 TFLOP/s: ${PEAK:-unknown (no MFU column)}"
BENCH=(-m benchmarks.model_steps --device cuda --variants standard coupled coupled:impl=eager --vocab-size 32000
       --sdpa flash --repeats 10 --steps 5 --warmup 3 --out "$OUT/BENCHMARKS.gpu.md" ${PEAK:+--peak-tflops "$PEAK"})
"$PY" "${BENCH[@]}" --preset 60m --batch-size 32
"$PY" "${BENCH[@]}" --preset 150m --batch-size 16

"$PY" -m orchestrator.cli run jobs/gpu-smoke.yaml
"$PY" - <<'PY' | tee "$OUT/stack.txt"
import mlflow
mlflow.set_tracking_uri("sqlite:///runs/gpu-smoke/mlflow.db")
for r in mlflow.search_runs(experiment_names=["gpu-smoke"], output_format="list"):
    m = r.data.metrics
    print(f"stack run {r.data.tags.get('variant')}: tokens/s {m.get('throughput/tokens_per_s', float('nan')):,.0f}, "
          f"MFU {m.get('throughput/mfu', float('nan')):.1%}, wall {m.get('time/wall_s', float('nan')):.0f} s")
PY

"""LR tuning: the grid's validation, the tuning runs, and the choice of each arm's LR."""

import math

import pytest
from pydantic import ValidationError

from orchestrator.plan.ladder import FieldError
from orchestrator.plan.tuning import Arm, TuneSpec, TuningResult, choose_lr, tuning_flops, tuning_runs, tuning_steps

TPS = 16 * 128
ARMS = [
    Arm("standard", "cpu-xs", 100, TPS, 10_000),
    Arm("coupled", "cpu-xs", 96, TPS, 10_400),
    Arm("standard", "cpu-s", 80, TPS, 40_000),
    Arm("coupled", "cpu-s", 78, TPS, 41_000),
]


def _err(**kw):
    with pytest.raises(ValidationError) as e:
        TuneSpec(**{"lr": [1e-3, 3e-3], "tokens": 0.25, **kw})
    err = e.value.errors()[0]
    return err["loc"], err["msg"]


def test_valid_grid_is_sorted_and_tokens_keep_their_meaning():
    t = TuneSpec(lr=[3e-3, 1e-3, 1e-2], tokens=20_000)
    assert t.lr == [1e-3, 3e-3, 1e-2] and t.tokens == 20_000 and isinstance(t.tokens, int) and t.seeds is None
    assert isinstance(TuneSpec(lr=[1e-3], tokens=1.0).tokens, float)


@pytest.mark.parametrize(
    "kw, loc, msg",
    [
        ({"lr": [1e-3, -1e-3]}, ("lr",), "entry 1 (-0.001) is not a positive learning rate"),
        ({"lr": [0.0]}, ("lr",), "entry 0 (0.0) is not a positive"),
        ({"lr": [float("inf")]}, ("lr",), "is not a positive"),
        ({"lr": []}, ("lr",), "at least 1 item"),
        ({"lr": [1e-3, 1e-3]}, ("lr",), "learning rates repeat"),
        ({"tokens": 1.5}, ("tokens",), "a fraction of the planned budget must be in (0, 1], got 1.5"),
        ({"tokens": 0.0}, ("tokens",), "must be in (0, 1]"),
        ({"tokens": 0}, ("tokens",), "at least 1 token"),
        ({"tokens": True}, ("tokens",), "give an integer"),
        ({"tokens": "half"}, ("tokens",), "give an integer"),
        ({"seeds": []}, ("seeds",), "at least 1 item"),
        ({"seeds": [0, 0]}, ("seeds",), "distinct non-negative"),
        ({"colour": 1}, ("colour",), "Extra inputs"),
    ],
)
def test_bad_grids_are_refused_naming_the_field(kw, loc, msg):
    got_loc, got_msg = _err(**kw)
    assert got_loc == loc and msg in got_msg


def test_tuning_runs_per_variant_scale_lr_seed_with_their_own_identity():
    tune = TuneSpec(lr=[1e-3, 3e-3, 1e-2], tokens=0.25, seeds=[0, 1])
    runs = tuning_runs(tune, ARMS, default_seeds=[5, 6, 7])
    assert len(runs) == 4 * 3 * 2 and all(r.kind == "tune" for r in runs)
    steps = {(r.variant, r.scale): r.steps for r in runs}
    assert steps == {
        ("standard", "cpu-xs"): 25,
        ("coupled", "cpu-xs"): 24,
        ("standard", "cpu-s"): 20,
        ("coupled", "cpu-s"): 20,
    }  # 0.25 x planned steps: 25, 24, 20, 19.5 -> 20 (half to even)
    ids = [tuple(sorted(r.identity().items())) for r in runs]
    assert len(set(ids)) == len(runs)  # lr and seed enter identity
    assert ids == [tuple(sorted(r.identity().items())) for r in tuning_runs(tune, ARMS, [5, 6, 7])]  # resubmit: same
    r = runs[0]
    assert r.identity() == {"kind": "tune", "variant": "standard", "scale": "cpu-xs", "lr": 1e-3, "seed": 0, "steps": 25}
    assert r.run_name == "tune-standard-cpu-xs-lr0.001-s0" and r.tokens == 25 * TPS
    assert r.total_flops == 25 * TPS * 10_000
    # default seeds: the study's first
    assert {r.seed for r in tuning_runs(TuneSpec(lr=[1e-3], tokens=4096), ARMS, [5, 6])} == {5}


def test_absolute_tuning_tokens_round_to_steps_and_tiny_budgets_are_refused():
    assert tuning_steps(TuneSpec(lr=[1e-3], tokens=10_000), ARMS[0]) == 5  # 10000 / 2048 = 4.88
    with pytest.raises(FieldError) as e:
        tuning_runs(TuneSpec(lr=[1e-3], tokens=500), ARMS, [0])
    assert e.value.loc == ("tune", "tokens") and "less than one optimizer step" in str(e.value)
    with pytest.raises(FieldError):
        tuning_steps(TuneSpec(lr=[1e-3], tokens=0.001), ARMS[0])  # 0.1 steps


def test_tuning_compute_is_separate_and_adds_up():
    runs = tuning_runs(TuneSpec(lr=[1e-3, 3e-3], tokens=0.5), ARMS, [0])
    flops = tuning_flops(runs)
    assert flops[("standard", "cpu-xs")] == 2 * 50 * TPS * 10_000
    assert flops[("coupled", "cpu-s")] == 2 * 39 * TPS * 41_000
    assert sum(flops.values()) == sum(r.total_flops for r in runs)
    main = sum(a.planned_steps * a.tokens_per_step * a.flops_per_token for a in ARMS)
    assert sum(flops.values()) == pytest.approx(main, rel=0.02)  # 2 LRs x half the budget ~ one main budget


GRID = [1e-3, 3e-3, 1e-2]


def _res(variant, lr, seed, loss, status="finished", scale="cpu-xs"):
    return TuningResult(variant, scale, lr, seed, loss, status)


def test_choose_lr_is_the_grid_argmin_of_the_seed_mean():
    results = [
        _res("standard", 1e-3, 0, 3.30),
        _res("standard", 1e-3, 1, 3.32),
        _res("standard", 3e-3, 0, 3.20),
        _res("standard", 3e-3, 1, 3.26),
        _res("standard", 1e-2, 0, 3.10),
        _res("standard", 1e-2, 1, 3.40),
    ]  # mean 3.25 vs 3.23
    c = choose_lr(results, GRID, [0, 1])[("standard", "cpu-xs")]
    assert c.lr == 3e-3 and c.val_loss == pytest.approx(3.23) and c.edge is None and c.complete
    assert c.table == pytest.approx({1e-3: 3.31, 3e-3: 3.23, 1e-2: 3.25})
    # negative control: per-seed minima disagree (seed 0 alone would pick 1e-2)
    assert choose_lr(results, GRID, [0])[("standard", "cpu-xs")].lr == 1e-2


def test_diverged_and_failed_runs_count_as_infinite_loss():
    results = [
        _res("differential", 1e-3, 0, 3.30),
        _res("differential", 1e-3, 1, 3.31),
        _res("differential", 3e-3, 0, 3.10),
        _res("differential", 3e-3, 1, float("nan")),  # blew up
        _res("differential", 1e-2, 0, None, "diverged"),
        _res("differential", 1e-2, 1, 3.0, "failed"),
    ]
    c = choose_lr(results, GRID, [0, 1])[("differential", "cpu-xs")]
    assert c.table[3e-3] == math.inf and c.table[1e-2] == math.inf
    assert c.lr == 1e-3 and c.edge == "lowest" and c.val_loss == pytest.approx(3.305)
    every = [_res("x", lr, 0, None, "failed") for lr in GRID]
    assert choose_lr(every, GRID, [0])[("x", "cpu-xs")].lr is None


def test_edge_flags_and_ties():
    hi = [_res("s", lr, 0, loss) for lr, loss in zip(GRID, [3.3, 3.2, 3.1])]
    assert choose_lr(hi, GRID, [0])[("s", "cpu-xs")].edge == "highest"
    tie = [_res("s", lr, 0, loss) for lr, loss in zip(GRID, [3.3, 3.1, 3.1])]
    assert choose_lr(tie, GRID, [0])[("s", "cpu-xs")].lr == 3e-3  # ties go to the smaller LR
    one = choose_lr([_res("s", 1e-3, 0, 3.0)], [1e-3], [0])[("s", "cpu-xs")]
    assert one.lr == 1e-3 and one.edge == "only"


def test_choice_per_arm_with_missing_runs_and_string_round_tripped_lrs():
    results = [
        _res("standard", float(str(3e-3)), 0, 3.2),
        _res("standard", 1e-3, 0, 3.3),
        _res("coupled", 1e-2, 0, 3.0, scale="cpu-s"),
        _res("coupled", 1e-3, 0, 3.1, scale="cpu-s"),
        _res("standard", 1e-2, 0, 9.9, "running"),  # not a result yet
        _res("standard", 3e-2, 0, 1.0),
        _res("standard", 1e-2, 7, 1.0),
    ]  # off-grid LR / seed: ignored
    out = choose_lr(results, GRID, [0])
    assert set(out) == {("standard", "cpu-xs"), ("coupled", "cpu-s")}
    s = out[("standard", "cpu-xs")]
    assert s.lr == 3e-3 and not s.complete and s.missing == ((1e-2, 0),) and math.isnan(s.table[1e-2])
    c = out[("coupled", "cpu-s")]
    assert c.lr == 1e-2 and c.edge == "highest" and c.missing == ((3e-3, 0),)

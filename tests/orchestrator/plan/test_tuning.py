"""LR tuning: the grid's validation, the tuning runs, and the choice of each arm's LR."""

import math

import pytest
from pydantic import ValidationError

from orchestrator.plan.ladder import FieldError
from orchestrator.plan.tuning import Arm, TuneSpec, TuningResult, choose_lr, extension_lrs, tuning_flops, tuning_runs, tuning_steps

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
        ({"lr": [float("inf")]}, ("lr",), "must be a finite number, not inf"),
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
    tune = TuneSpec(lr=[1e-3, 3e-3, 1e-2], tokens=0.25, seeds=[0, 1], min_steps=1)
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
    assert {r.seed for r in tuning_runs(TuneSpec(lr=[1e-3], tokens=4096, min_steps=1), ARMS, [5, 6])} == {5}


def test_absolute_tuning_tokens_round_to_steps_and_tiny_budgets_are_refused():
    assert tuning_steps(TuneSpec(lr=[1e-3], tokens=10_000, min_steps=5), ARMS[0]) == 5  # 10000 / 2048 = 4.88
    with pytest.raises(FieldError) as e:
        tuning_runs(TuneSpec(lr=[1e-3], tokens=500, min_steps=1), ARMS, [0])
    assert e.value.loc == ("tune", "tokens") and "less than one optimizer step" in str(e.value)
    with pytest.raises(FieldError):
        tuning_steps(TuneSpec(lr=[1e-3], tokens=0.001, min_steps=1), ARMS[0])  # 0.1 steps


def test_tuning_compute_is_separate_and_adds_up():
    runs = tuning_runs(TuneSpec(lr=[1e-3, 3e-3], tokens=0.5, min_steps=1), ARMS, [0])
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


def _curve(best_lr, floor=3.0, width=0.5):
    """A loss-vs-LR bowl in log LR with its minimum ``floor`` at ``best_lr``: a known answer."""
    return lambda lr: floor + width * math.log(lr / best_lr) ** 2


def _tune_loop(curve, grid, max_per_side, unigram=None, loss_of=None):
    """What the driver does, on synthetic losses: choose, extend the edge arms, train, choose
    again, until no arm extends. Returns (the final choice, the LRs trained in order)."""
    trained, extra = list(grid), {}
    while True:
        results = [_res("s", lr, 0, curve(lr), **(loss_of or {})) for lr in trained]
        choice = choose_lr(results, grid, [0], unigram=unigram, extra=extra)[("s", "cpu-xs")]
        more = extension_lrs({("s", "cpu-xs"): choice}, grid, max_per_side)
        if not more:
            return choice, trained
        extra.setdefault(("s", "cpu-xs"), []).append(more["s", "cpu-xs"])
        trained.append(more["s", "cpu-xs"])


def test_an_optimum_below_the_grid_extends_to_it_by_the_grid_ratio_and_ends_interior():
    c, trained = _tune_loop(_curve(3e-4), GRID, max_per_side=2)
    assert trained[3:] == [3.333e-4, 1.111e-4]  # 1e-3 / 3, then / 3 again: the grid's own ratio
    assert c.lr == 3.333e-4 and c.edge is None and c.extended == (2, 0) and c.note == "interior after 2 extensions"
    assert sorted(c.table) == [1.111e-4, 3.333e-4, *GRID]


def test_an_optimum_above_the_grid_extends_upward():
    c, trained = _tune_loop(_curve(4e-2), GRID, max_per_side=2)
    assert trained[3:] == [pytest.approx(3.333e-2), pytest.approx(0.1111)] and c.lr == 3.333e-2 and c.extended == (0, 2)


def test_the_bound_stops_the_extension_and_the_choice_says_it_is_still_at_the_edge():
    c, trained = _tune_loop(_curve(1e-5), GRID, max_per_side=2)
    assert len(trained) == 5 and c.lr == 1.111e-4 and c.edge == "lowest"
    assert c.note == "at the lowest edge after 2 extensions"
    # extend_edges 0 never extends: the edge is reported as before
    c0, trained0 = _tune_loop(_curve(1e-5), GRID, max_per_side=0)
    assert trained0 == GRID and c0.lr == 1e-3 and c0.note == "at the lowest edge of the grid"


def test_negative_control_an_interior_optimum_does_not_extend():
    c, trained = _tune_loop(_curve(3e-3), GRID, max_per_side=2)
    assert trained == GRID and c.lr == 3e-3 and c.extended == (0, 0) and c.note == ""
    # nor does an arm with a tuning run still missing, nor a one-point grid (it has no ratio)
    partial = choose_lr([_res("s", 1e-3, 0, 3.0), _res("s", 3e-3, 0, 3.5)], GRID, [0])
    assert extension_lrs(partial, GRID, 2) == {}
    assert extension_lrs(choose_lr([_res("s", 1e-3, 0, 3.0)], [1e-3], [0]), [1e-3], 2) == {}


def test_a_run_above_the_unigram_perplexity_is_flagged_and_never_chosen():
    unigram = {"stdlib": math.exp(5.5)}  # ln(unigram ppl) = 5.5 nats/token
    loss = {(1e-3, 0): 4.6, (1e-3, 1): 4.6, (3e-3, 0): 4.5, (3e-3, 1): 4.5, (1e-2, 0): 2.0, (1e-2, 1): 6.0}
    # 1e-2 seed 1 ends above unigram, though its point's mean (4.0) is the lowest
    results = [TuningResult("s", "cpu-xs", lr, seed, x, "finished", "stdlib") for (lr, seed), x in loss.items()]
    c = choose_lr(results, GRID, [0, 1], unigram=unigram)[("s", "cpu-xs")]
    assert c.lr == 3e-3 and c.above_unigram == (1e-2,) and c.table[1e-2] == pytest.approx(4.0)
    # negative controls: with the bar above every run, without one, or with another corpus's bar, 1e-2 wins
    assert choose_lr(results, GRID, [0, 1], unigram={"stdlib": math.exp(7.0)})[("s", "cpu-xs")].lr == 1e-2
    assert choose_lr(results, GRID, [0, 1])[("s", "cpu-xs")].lr == 1e-2
    other = choose_lr(results, GRID, [0, 1], unigram={"kerneldoc": math.exp(5.5)})[("s", "cpu-xs")]
    assert other.lr == 1e-2 and other.above_unigram == ()


def test_when_every_point_is_above_unigram_nothing_is_chosen_and_the_grid_grows_toward_the_lowest_loss():
    results = [TuningResult("s", "cpu-xs", lr, 0, loss, "finished", "c") for lr, loss in zip(GRID, [7.0, 6.5, 6.2])]
    c = choose_lr(results, GRID, [0], unigram={"c": math.exp(6.0)})["s", "cpu-xs"]
    assert c.lr is None and c.above_unigram == tuple(GRID) and c.note == ""
    assert extension_lrs({("s", "cpu-xs"): c}, GRID, 2) == {("s", "cpu-xs"): pytest.approx(3.333e-2)}


def test_per_corpus_tuning_chooses_each_corpus_its_own_lr():
    best = {"code": 1e-2, "prose": 1e-3}
    results = [TuningResult("s", "cpu-xs", lr, 0, _curve(best[corpus])(lr), "finished", corpus) for corpus in best for lr in GRID]
    per = choose_lr(results, GRID, [0], per_corpus=True)
    assert {k: c.lr for k, c in per.items()} == {("s", "cpu-xs", "code"): 1e-2, ("s", "cpu-xs", "prose"): 1e-3}
    assert per["s", "cpu-xs", "code"].corpus == "code"
    # negative control: one (variant, scale) arm over both corpora's runs
    assert set(choose_lr(results, GRID, [0])) == {("s", "cpu-xs")}


def test_tuning_runs_shorter_than_min_steps_are_refused_naming_the_fields():
    with pytest.raises(FieldError) as e:
        tuning_steps(TuneSpec(lr=[1e-3], tokens=0.25), ARMS[0])  # 25 steps, default minimum 50
    assert e.value.loc == ("tune", "tokens")
    assert (
        "tuning runs of standard @ cpu-xs would be 25 optimizer steps, fewer than tune.min_steps (50): "
        "give at least 102,400 tokens (a fraction >= 0.5 of the planned budget), or lower tune.min_steps"
    ) in str(e.value)
    # negative control: at the minimum it plans
    assert tuning_steps(TuneSpec(lr=[1e-3], tokens=0.5), ARMS[0]) == 50


def test_extension_and_min_steps_fields_are_validated():
    t = TuneSpec(lr=[1e-3, 3e-3], tokens=0.25)
    assert (t.extend_edges, t.min_steps, t.per_corpus) == (2, 50, False)
    assert TuneSpec(lr=[1e-3], tokens=0.25).extend_edges == 2  # the default on a one-point grid: never used
    loc, msg = _err(lr=[1e-3], extend_edges=1)
    assert loc == ("extend_edges",) and "a one-point grid has no ratio to extend by" in msg
    assert TuneSpec(lr=[1e-3], tokens=0.25, extend_edges=0).extend_edges == 0
    assert _err(extend_edges=-1)[0] == ("extend_edges",) and _err(min_steps=0)[0] == ("min_steps",)

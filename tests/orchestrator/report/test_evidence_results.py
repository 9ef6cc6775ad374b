"""The evidence studies (RESULTS.md, results/cpu-*): each published report regenerates from
its published MLflow store (every table the published folder and the regenerated report share
agrees), every number RESULTS.md quotes is the regenerated report's, and the study's own
acceptance holds in the data: every arm's final perplexity is at most half its corpus's unigram
perplexity, and the reference's finals at x1, x1.5, x2, x3 fall with tokens in every seed (the
token ratio interpolates a real curve, not schedule noise)."""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from orchestrator.report import build_report
from orchestrator.report.stats import recall
from tests import published
from tests.helpers import REPO, qk
from tests.published import Quote, assert_shared_tables_equal, unzip_store

RESULTS = REPO / "results"
MAIN = "cpu-evidence"
MQAR = ("cpu-evidence-mqar-easy", "cpu-evidence-mqar-medium")  # 150 steps: RESULTS.md's OLD_MQAR section
CONVERGED = "cpu-mqar-easy-lr1e-3"  # MQAR trained to convergence, every arm at LR 1e-3: CONVERGED_MQAR
TUNED = "cpu-mqar-easy"  # its attempt at tuned LRs, stopped when they did not learn: TUNED_MQAR
LADDER = "cpu-ladder-gated"  # five rungs, LR tuned per rung, the gate on: LADDER_SECTION
CONTROLS = "cpu-controls"  # four arms on the GPT-2 recipe, LR tuned per arm: CONTROLS_SECTION
MODERN = "cpu-controls-modern"  # standard vs coupled on the modern recipe: CONTROLS_SECTION
OLD_MQAR, CONVERGED_MQAR, TUNED_MQAR = "## MQAR at 150 steps", "## MQAR trained to convergence", "### At the tuned LR"
LADDER_SECTION = "## A five-rung gated ladder"
CONTROLS_SECTION = "## Coupling against the strongest controls"
ANSWERS = "## The answers"  # the opening table: claim, number with its interval, verdict by the rule
STUDIES = (MAIN, *MQAR, TUNED, CONVERGED, LADDER, CONTROLS, MODERN)
# Reports built with their spec: the tuned MQAR study stopped before its plan ended (the report lists
# the runs never trained); the ladder's gate and its saving, and the controls' contrasts, are known
# from the spec only.
WITH_SPEC = {TUNED, LADDER, CONTROLS}
TEXT = (REPO / "RESULTS.md").read_text() if (REPO / "RESULTS.md").exists() else ""
UNIGRAM_QUOTED = {"medium"}  # the MQAR presets whose unigram perplexity RESULTS.md prints


def _store(study: str) -> Path:
    return RESULTS / f"{study}-mlflow.db.gz"


pytestmark = pytest.mark.skipif(not _store(MAIN).exists(), reason="no published cpu-evidence store")


def _folders(study: str, root: Path = RESULTS) -> list[Path]:
    """The report's per-corpus folders under ``root / study``, named as in the published report
    (a one-corpus study writes its tables at the top)."""
    subs = sorted(p.name for p in (RESULTS / study).iterdir() if p.is_dir())
    return [root / study / s for s in subs] or [root / study]


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory):
    """A root holding each study's report, each built at most once from its published store."""
    root = tmp_path_factory.mktemp("evidence")
    built: set[str] = set()

    def get(study: str) -> Path:
        if study not in built:
            (root / f"{study}-store").mkdir()
            uri = unzip_store(_store(study), root / f"{study}-store")
            if study in WITH_SPEC:  # as RESULTS.md's "How to regenerate" does
                spec = str(REPO / "jobs" / f"{study}.yaml")
                res = qk("report", spec, "--tracking-uri", uri, "--out", str(root / study), "--no-log", cwd=REPO)
                assert res.returncode == 0, res.stderr[-3000:]
            else:
                build_report(study, uri, root / study, log_to_mlflow=False)
            built.add(study)
        return root

    return get


def _pct(x: float) -> str:
    """A fraction as RESULTS.md prints it: one decimal, two below 1%."""
    return f"{100 * x:.1f}" if x >= 0.01 else f"{100 * x:.2f}"


def _p(p: float) -> str:
    """A p-value as RESULTS.md prints it: three decimals below 0.05, else two."""
    return f"{p:.3f}" if p < 0.05 else f"{p:.2f}"


def _acc(x: float) -> str:
    """An accuracy near 100% as RESULTS.md prints it: a percentage with two decimals (99.96, not 100.0)."""
    return f"{100 * x:.2f}"


def quoted_numbers(root: Path) -> list[Quote]:
    """What RESULTS.md must quote, formatted from the reports under ``root`` (one folder per
    study, the published layout) as the page prints them: (section heading or None, exact text)."""
    out: list[Quote] = []
    for folder in _folders(MAIN, root):
        corpus = folder.name
        fp = pd.read_csv(folder / "final_ppl.csv")
        uni = pd.read_csv(folder / "unigram.csv").set_index("variant")
        tr = pd.read_csv(folder / "token_ratio.csv").set_index("variant")
        paired = pd.read_csv(folder / "paired.csv").set_index("variant")
        tuning = pd.read_csv(folder / "tuning.csv").set_index("variant")
        cost = pd.read_csv(folder / "cost.csv").set_index("variant")
        att = pd.read_csv(folder / "attention.csv").set_index("variant")
        u0 = uni["unigram_ppl"].iloc[0]
        out.append((None, f"{u0:.1f}"))
        sec = f"### {corpus}: unigram perplexity {u0:.1f}"
        out.append((None, sec))
        for r in fp.itertuples():
            v = r.variant
            out.append((None, f"{r.mean_ppl:.2f} ± {r.std:.2f}"))
            out.append((None, f"{tuning.loc[v, 'chosen_lr']:g}"))
            if v in tr.index:
                out.append((None, f"{tr.loc[v, 'token_ratio']} {tr.loc[v, 'interval_95']}"))
            if v in paired.index:
                p = paired.loc[v]
                vs = (
                    f"{p.paired_ppl_pct:+.1f}% [{p.paired_ppl_pct_low:+.1f}, {p.paired_ppl_pct_high:+.1f}] | "
                    f"{_p(p.p_value)} | {p.verdict} | {p.detectable:.3f} | {int(p.seeds_needed)} | "
                    f"{tr.loc[v, 'token_ratio']} {tr.loc[v, 'interval_95']}"
                )
            else:
                vs = "reference | reference | reference | reference | reference | -"
            out.append(
                (
                    sec,
                    f"| {v} | {tuning.loc[v, 'chosen_lr']:g} | {r.mean_ppl:.2f} ± {r.std:.2f} ({r.n_seeds}) | "
                    f"{uni.loc[v, 'ppl_over_unigram']:.2f} ({uni.loc[v, 'worst_seed_over_unigram']:.2f}) | {vs} | "
                    f"{cost.loc[v, 'time_per_token_ratio']:.2f} | {att.loc[v, 'effective_rank']:.1f} |",
                )
            )
        for r in paired.itertuples():
            out.append((None, f"{r.paired_ppl_pct:+.1f}% [{r.paired_ppl_pct_low:+.1f}, {r.paired_ppl_pct_high:+.1f}]"))
        runs = pd.read_csv(folder / "runs.csv")
        ref = runs[runs["variant"] == "standard"].sort_values(["seed", "extend"])
        cells = [" / ".join(f"{p:.2f}" for p in g["final_ppl"]) for _, g in ref.groupby("seed")]
        out.append(("### The reference's curve (the ratio interpolates a real curve)", f"| {corpus} | " + " | ".join(cells) + " |"))
        if corpus == "stdlib":  # the LRs were tuned on stdlib: its tuning losses at the chosen LR
            t = tuning.apply(lambda r: r[f"lr {r['chosen_lr']:g}"], axis=1)
            out.append(
                (
                    "## Results per corpus",
                    f"standard {t['standard']:.3f}, coupled {t['coupled']:.3f}, uncoupled {t['uncoupled_mlp']:.3f} nats",
                )
            )
    for study in MQAR:
        preset = study.rsplit("-", 1)[1]
        for folder in _folders(study, root):
            acc = pd.read_csv(folder / "accuracy.csv").set_index("variant")
            uni = pd.read_csv(folder / "unigram.csv").set_index("variant")
            for r in pd.read_csv(folder / "final_ppl.csv").itertuples():
                a = acc.loc[r.variant]
                row = f"| {preset} | {r.variant} | {_pct(a['mean'])}% ± {_pct(a['std'])} | {r.mean_ppl:.2f} ± {r.std:.2f} |"
                out.append((OLD_MQAR, row))
                if preset in UNIGRAM_QUOTED:
                    out.append((OLD_MQAR, f"{row} {uni.loc[r.variant, 'unigram_ppl']:.1f} |"))
    return (
        out
        + converged_quotes(root / TUNED, TUNED_MQAR)
        + converged_quotes(root / CONVERGED, CONVERGED_MQAR, answers=True)
        + ladder_quotes(root / LADDER)
        + controls_quotes(root)
    )


def _delta(d: float, low: float, high: float) -> str:
    """A paired difference in nats with its interval, as RESULTS.md prints it."""
    return f"{d:+.4f} [{low:+.4f}, {high:+.4f}]"


def controls_quotes(root: Path) -> list[Quote]:
    """The controls studies as RESULTS.md prints them under CONTROLS_SECTION: per recipe and arm
    the tuning val loss at each grid point and the chosen LR (tuned on stdlib, seed 0); per
    corpus and arm the final perplexity and the paired final-loss difference from standard at
    equal model FLOPs with its p and verdict; the coupled-vs-control contrasts in every currency
    (FLOPs, tokens, wall-clock); in the opening table, the paper's loss and effective-rank claims per recipe
    and corpus with their decisions."""
    out: list[Quote] = []
    for study, recipe in ((CONTROLS, "GPT-2"), (MODERN, "modern")):
        tuning = pd.read_csv(root / study / "stdlib" / "tuning.csv")
        grid = sorted((c for c in tuning.columns if c.startswith("lr ")), key=lambda c: float(c[3:]))
        for t in tuning.to_dict("records"):
            losses = " / ".join(f"{t[c]:.4f}" for c in grid)
            out.append((CONTROLS_SECTION, f"| {recipe} | {t['variant']} | {losses} | {t['chosen_lr']:g} |"))
        for folder in _folders(study, root):
            corpus = folder.name
            fp = pd.read_csv(folder / "final_ppl.csv").set_index("variant")
            lr = pd.read_csv(folder / "tuning.csv").set_index("variant")["chosen_lr"]
            contrasts = pd.read_csv(folder / "contrasts.csv")
            eq = contrasts.query("currency == 'flops' and against == 'standard'").set_index("variant")
            for v, r in fp.iterrows():
                if v in eq.index:
                    d = eq.loc[v]
                    vs = f"{_delta(d.paired_dloss, d.paired_low, d.paired_high)} | {_p(d.p_value)} | {d.verdict}"
                else:
                    vs = "reference | - | -"
                out.append((CONTROLS_SECTION, f"| {recipe} | {corpus} | {v} | {lr[v]:g} | {r.mean_ppl:.2f} ± {r['std']:.2f} | {vs} |"))
            for c in contrasts[contrasts["against"] != "standard"].itertuples():
                out.append(
                    (
                        CONTROLS_SECTION,
                        f"| {corpus} | {c.variant} - {c.against} | {c.currency} | "
                        f"{_delta(c.paired_dloss, c.paired_low, c.paired_high)} | {_p(c.p_value)} | {c.verdict} |",
                    )
                )
            for c in pd.read_csv(folder / "claims.csv").itertuples():
                if c.claim.startswith("coupled has lower loss"):
                    out.append((ANSWERS, f"{recipe} {corpus} {_delta(c.estimate, c.low, c.high)} {c.decision}"))
                elif c.claim.startswith("coupling raises"):  # effective rank, in units of rank
                    out.append((ANSWERS, f"{recipe} {corpus} {c.estimate:+.2f} [{c.low:+.2f}, {c.high:+.2f}] {c.decision}"))
    return out


def ladder_quotes(folder: Path) -> list[Quote]:
    """The gated ladder's row per rung as RESULTS.md prints it (N, tokens, tuned LRs, each arm's
    perplexity, the paired Δ at equal model FLOPs with its interval), the fit's refusal, the
    gate's saving and, in the opening table, the paired final-loss claim per rung."""
    fp = pd.read_csv(folder / "final_ppl.csv").set_index(["scale", "variant"])
    eq = pd.read_csv(folder / "contrasts.csv").query("currency == 'flops'").set_index("scale")
    lr = pd.read_csv(folder / "tuning.csv").set_index(["variant", "scale"])["chosen_lr"]
    claims = pd.read_csv(folder / "claims.csv").query("claim == 'coupled has lower loss than standard'").set_index("scale")
    summary = json.loads((folder / "summary.json").read_text())
    out: list[Quote] = []
    cells = []
    for scale in summary["scales"]:
        sc = scale["scale"]
        std, cpl, d = fp.loc[(sc, "standard")], fp.loc[(sc, "coupled")], eq.loc[sc]
        out.append(
            (
                LADDER_SECTION,
                f"| {sc} | {int(std.n_params):,} | {int(std.tokens):,} | {lr[('standard', sc)]:g} / {lr[('coupled', sc)]:g} | "
                f"{std.mean_ppl:.2f} ± {std['std']:.2f} | {cpl.mean_ppl:.2f} ± {cpl['std']:.2f} | "
                f"{_delta(d.paired_dloss, d.paired_low, d.paired_high)} |",
            )
        )
        c = claims.loc[sc]
        cells.append(f"{sc} {_delta(c.estimate, c.low, c.high)}")
    out.append((ANSWERS, "; ".join(cells)))
    for v in ("standard", "coupled"):  # why no backtest: "the best fit sits on the parameter bound E = 0 (lower)"
        why = summary["scaling"]["fits"][v]["backtest"]["reason"]
        out.append((LADDER_SECTION, why.removeprefix("the best fit ").removesuffix(" (lower)")))
    flops_fit = summary["scaling"]["fits"]["standard"]["flops"]["fit"]
    out.append((LADDER_SECTION, f"E {flops_fit['E']:.4f} nats, alpha {flops_fit['alpha']:.3f}, rmse {flops_fit['rmse']:.3f}"))
    b = summary["scaling"]["fits"]["standard"]["backtest_flops"]
    out.append((LADDER_SECTION, f"predicts {b['held_out']} at {b['predicted']:.4f} nats [{b['low']:.4f}, {b['high']:.4f}]"))
    out.append((LADDER_SECTION, f"Observed: {b['observed']:.4f} over {b['n_seeds']} seeds"))
    out.append((LADDER_SECTION, f"an error of {b['error']:+.4f} nats, inside the 95% prediction interval"))
    out.append((LADDER_SECTION, f"decided after {', '.join(summary['gate']['decided_after'])} (after"))
    saving = summary["gate_saving"]
    out.append((LADDER_SECTION, f"{saving['saved_flops']:.0f} of the plan's {saving['planned_flops']:.3g} training FLOPs"))
    return out


def converged_quotes(folder: Path, heading: str, answers: bool = False) -> list[Quote]:
    """An MQAR study's row per arm, as RESULTS.md prints it under ``heading``: the tuned LR (a
    tuned study), final accuracy (mean ± std over seeds; one seed: its value), each seed's tokens
    to 50% and 90% accuracy, the token ratio at 90% with its interval (or bound, or why none);
    with ``answers``, in the opening table, the report's two MQAR claims with their intervals
    and decisions (coupled's final accuracy, the token ratio at 90%)."""
    acc = pd.read_csv(folder / "accuracy.csv").set_index("variant")
    cross = pd.read_csv(folder / "accuracy_crossings.csv")
    ratios = {r["variant"]: recall.display_ratio(r) for r in pd.read_csv(folder / "accuracy_ratio.csv").to_dict("records")}
    tuning = pd.read_csv(folder / "tuning.csv").set_index("variant") if (folder / "tuning.csv").exists() else None
    at = [recall.seed_crossings(cross, th) for th in recall.THRESHOLDS]
    out = []
    for v, a in acc.iterrows():
        cells = " | ".join(per[(a["scale"], v)] for per in at)
        lr = "" if tuning is None else f" {tuning.loc[v, 'chosen_lr']:g} |"
        final = f"{_acc(a['mean'])}% ± {_acc(a['std'])}" if a["n_seeds"] > 1 else f"{_acc(a['mean'])}%"
        out.append((heading, f"| {v} |{lr} {final} | {cells} | {ratios.get(v, 'reference')} |"))
    if not answers:
        return out
    for c in pd.read_csv(folder / "claims.csv").itertuples():
        if c.claim.startswith("coupled recalls perfectly"):
            out.append((ANSWERS, f"{_acc(c.estimate)}% [{_acc(c.low)}, {_acc(c.high)}] | **{c.decision.capitalize()}**"))
        elif c.claim.startswith("coupled reaches 90%"):
            out.append((ANSWERS, f"{ratios['coupled']} | **{c.decision.capitalize()}**"))
    return out


def missing_quotes(text: str, root: Path) -> list[Quote]:
    """The numbers ``quoted_numbers(root)`` asks for that ``text`` does not print where it should."""
    return published.missing_quotes(text, quoted_numbers(root))


@pytest.mark.slow
@pytest.mark.parametrize("study", STUDIES)
def test_report_regenerates_from_the_published_store(regenerated, study):
    """Every table present both in the published folder and in the regenerated report agrees
    (a table the report gained since publication does not force regeneration)."""
    root = regenerated(study)
    for folder in _folders(study):
        rel = folder.relative_to(RESULTS / study)
        csvs = {p.name for p in folder.glob("*.csv")}
        assert "final_ppl.csv" in csvs and "unigram.csv" in csvs
        assert_shared_tables_equal(folder, root / study / rel, {"final_ppl.csv", "unigram.csv"}, f"{study}/{rel}")


@pytest.mark.slow
def test_results_md_quotes_the_regenerated_reports(regenerated):
    """Every final perplexity, unigram perplexity, tuned LR, token ratio and interval, paired
    difference with its p and verdict, time ratio, effective rank, per-seed reference final and
    MQAR accuracy that RESULTS.md prints is the regenerated reports' (a misquote fails here)."""
    assert TEXT, "RESULTS.md is missing"
    for study in STUDIES:
        root = regenerated(study)
    assert missing_quotes(TEXT, root) == []


def test_the_quote_check_fails_on_a_misquote(tmp_path):
    """Negative control: the published tables (the report's layout) pass the check; one paired
    difference moved by 0.1 point, or one MQAR accuracy typed wrong into the page, is reported."""
    for study in STUDIES:
        shutil.copytree(RESULTS / study, tmp_path / study, ignore=shutil.ignore_patterns("*.png", "*.html"))
    assert missing_quotes(TEXT, tmp_path) == []
    path = tmp_path / MAIN / "kerneldoc" / "paired.csv"
    paired = pd.read_csv(path)
    paired.loc[0, "paired_ppl_pct"] += 0.1
    paired.to_csv(path, index=False)
    r = paired.iloc[0]
    quoted = f"{r.paired_ppl_pct:+.1f}% [{r.paired_ppl_pct_low:+.1f}, {r.paired_ppl_pct_high:+.1f}]"
    missing = missing_quotes(TEXT, tmp_path)
    assert (None, quoted) in missing
    assert any(sec == "### kerneldoc: unigram perplexity 543.0" and f"| {r.variant} |" in s and quoted in s for sec, s in missing), missing
    shutil.copy(RESULTS / MAIN / "kerneldoc" / "paired.csv", path)
    typo = missing_quotes(TEXT.replace("| easy | coupled | 13.9% ± 6.9 |", "| easy | coupled | 13.8% ± 6.9 |"), tmp_path)
    assert typo == [(OLD_MQAR, "| easy | coupled | 13.9% ± 6.9 | 71.56 ± 16.98 |")], typo
    # the converged study: coupled's final accuracy moved by one point is reported under its heading
    path = tmp_path / CONVERGED / "accuracy.csv"
    acc = pd.read_csv(path)
    acc.loc[acc["variant"] == "coupled", "mean"] -= 0.01
    acc.to_csv(path, index=False)
    moved = missing_quotes(TEXT, tmp_path)
    assert len(moved) == 1 and moved[0][0] == CONVERGED_MQAR and moved[0][1].startswith("| coupled |"), moved
    shutil.copy(RESULTS / CONVERGED / "accuracy.csv", path)
    # the ladder: coupled's perplexity at one rung moved by 0.01 is reported in that rung's row
    path = tmp_path / LADDER / "final_ppl.csv"
    fp = pd.read_csv(path)
    fp.loc[(fp["variant"] == "coupled") & (fp["scale"] == "n800k"), "mean_ppl"] += 0.01
    fp.to_csv(path, index=False)
    moved = missing_quotes(TEXT, tmp_path)
    assert len(moved) == 1 and moved[0][0] == LADDER_SECTION and moved[0][1].startswith("| n800k |"), moved
    shutil.copy(RESULTS / LADDER / "final_ppl.csv", path)
    # the controls: coupled minus nonlinear_q at equal FLOPs on code moved by 0.001 nats is reported in its row
    path = tmp_path / CONTROLS / "stdlib" / "contrasts.csv"
    contrasts = pd.read_csv(path)
    contrasts.loc[(contrasts["against"] == "nonlinear_q") & (contrasts["currency"] == "flops"), "paired_dloss"] += 0.001
    contrasts.to_csv(path, index=False)
    moved = missing_quotes(TEXT, tmp_path)
    row = next(s for _, s in controls_quotes(tmp_path) if s.startswith("| stdlib | coupled - nonlinear_q | flops |"))
    assert moved == [(CONTROLS_SECTION, row)], moved


def test_every_arm_ends_at_most_half_the_unigram_perplexity():
    for study in (MAIN, CONTROLS, MODERN):  # MQAR is scored by accuracy; its filler tokens are uniform by design
        for folder in _folders(study):
            uni = pd.read_csv(folder / "unigram.csv")
            assert (uni["worst_seed_over_unigram"] <= 0.5).all(), uni


def test_standard_learns_mqar_easy_in_every_seed_at_lr_1e3_and_not_at_the_tuned_2e3():
    """The converged study's acceptance in its data: standard ends at 95% accuracy or more in every
    seed. The tuned study (LR 2e-3, from 600-step tuning runs) is the contrast the page reports:
    there standard stayed at a guess among the 4 values in context (under 30%)."""
    runs = pd.read_csv(RESULTS / CONVERGED / "runs.csv")
    std = runs[(runs["variant"] == "standard") & (runs["status"] == "finished")]
    assert sorted(std["seed"]) == [0, 1] and (std["final_accuracy"] >= 0.95).all(), std
    tuned = pd.read_csv(RESULTS / TUNED / "runs.csv")
    flat = tuned[(tuned["variant"] == "standard") & (tuned["status"] == "finished")]
    assert len(flat) and (flat["final_accuracy"] < 0.30).all(), flat


def test_reference_finals_fall_with_tokens_in_every_seed():
    for folder in _folders(MAIN):
        runs = pd.read_csv(folder / "runs.csv")
        ref = runs[(runs["variant"] == "standard") & (runs["status"] == "finished")]
        for seed, g in ref.groupby("seed"):
            g = g.sort_values("extend")
            assert list(g["extend"]) == [1.0, 1.5, 2.0, 3.0], (folder.name, seed)
            ppl = g["final_ppl"].to_numpy()
            assert (ppl[1:] < ppl[:-1]).all(), (folder.name, seed, ppl)


def _edges(study: str) -> dict[str, str]:
    """Per arm of ``study`` the grid edge its tuned LR sat on ('' when interior), from its report."""
    tuning = pd.read_csv(_folders(study)[0] / "tuning.csv", dtype={"edge": str}).fillna({"edge": ""})
    return dict(zip(tuning["variant"], tuning["edge"], strict=True))


def test_every_controls_arm_has_an_interior_lr_optimum():
    """The controls studies' acceptance in their data; the control is the text study, whose arms all
    sat on the bottom of their grid (the check sees an edge)."""
    for study in (CONTROLS, MODERN):
        assert set(_edges(study).values()) == {""}, (study, _edges(study))
    assert set(_edges(MAIN).values()) == {"lowest"}


def test_the_controls_gpt2_arms_reproduce_the_text_studys_x1_runs():
    """RESULTS.md's claim: standard, coupled and uncoupled_mlp at the same LR reproduce the text
    study's x1 finals (to 1e-4 relative on English, 4e-6 elsewhere); the control: nonlinear_q, which
    the text study lacks, is not the twin of its seed's standard run (relative gap above 1e-3)."""
    bound = {"stdlib": 4e-6, "kerneldoc": 1e-4, "mixed": 4e-6}
    for folder in _folders(MAIN):
        old = pd.read_csv(folder / "runs.csv").query("extend == 1.0").set_index(["variant", "seed"])["final_ppl"]
        new = pd.read_csv(RESULTS / CONTROLS / folder.name / "runs.csv").set_index(["variant", "seed"])["final_ppl"]
        assert len(old) == 9 and ((new.loc[old.index] / old - 1).abs() <= bound[folder.name]).all(), folder.name
        nq = new.xs("nonlinear_q", level="variant")
        assert ((nq / old.xs("standard", level="variant") - 1).abs() > 1e-3).all(), folder.name

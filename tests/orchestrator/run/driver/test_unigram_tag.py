"""A real tiny `qkstudy run` sets each corpus's unigram perplexity on the study's MLflow
experiment, and a re-run of the finished study sets it again without starting Ray, from
the prepared data alone (also data prepared before the manifest cached it)."""

import json
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from data_pipeline.loader import TokenLoader
from data_pipeline.unigram import unigram_perplexity
from tests.helpers import qk

pytestmark = pytest.mark.slow

PPL_TAG, TOKENS_TAG = "qkstudy.unigram_ppl.stdlib", "qkstudy.unigram_val_tokens.stdlib"


def _experiment(study):
    client = MlflowClient(study.tracking_uri)
    return client, client.get_experiment_by_name(study.name)


def _expected(study) -> tuple[float, int, dict]:
    """The add-one unigram perplexity of the val split recomputed here from the shards, the val
    split's tokens, and the prepared data's manifest."""
    data = Path(study.env["QKSTUDY_CACHE"]) / study.plan[0]["data_hash"]
    manifest = json.loads((data / "manifest.json").read_text())
    tokens = {s: np.concatenate(TokenLoader(str(data), s, 64, 1, seed=0)._parts) for s in ("train", "val")}
    return unigram_perplexity(tokens["train"], tokens["val"], 512), tokens["val"].size, manifest


def test_a_run_sets_the_unigram_tag(tiny_study):
    expected, val_tokens, manifest = _expected(tiny_study)
    _, exp = _experiment(tiny_study)
    assert float(exp.tags[PPL_TAG]) == pytest.approx(expected, rel=1e-12) == manifest["unigram"]["val_ppl"]
    assert int(exp.tags[TOKENS_TAG]) == val_tokens == manifest["splits"]["val"]["tokens"]
    assert f"unigram perplexity {expected:.2f}" in tiny_study.log


def test_a_finished_rerun_sets_it_again_from_the_prepared_data(tiny_study_copy):
    """A store and data without the unigram tag and manifest entry (as older stores are). The re-run of the
    finished study skips Ray and still records it, counted from the shards; with its data gone
    (cache cleared) the re-run says so and still succeeds."""
    study = tiny_study_copy
    expected, val_tokens, manifest = _expected(study)
    data = Path(study.env["QKSTUDY_CACHE"]) / study.plan[0]["data_hash"]
    client, exp = _experiment(study)
    client.delete_experiment_tag(exp.experiment_id, PPL_TAG)
    client.delete_experiment_tag(exp.experiment_id, TOKENS_TAG)
    del manifest["unigram"]
    (data / "manifest.json").write_text(json.dumps(manifest))
    res = qk("run", study.spec.name, cwd=study.folder, env=study.env)
    assert res.returncode == 0 and "skipped (Ray not started)" in res.stderr, res.stderr[-3000:]
    _, exp = _experiment(study)
    assert float(exp.tags[PPL_TAG]) == pytest.approx(expected, rel=1e-12)
    assert int(exp.tags[TOKENS_TAG]) == val_tokens

    client.delete_experiment_tag(exp.experiment_id, PPL_TAG)
    (data / "manifest.json").unlink()
    res = qk("run", study.spec.name, cwd=study.folder, env=study.env)
    assert res.returncode == 0 and "unigram perplexity not recorded" in res.stderr, res.stderr[-3000:]
    assert PPL_TAG not in _experiment(study)[1].tags

"""prepare runs as a Ray task (how the orchestrator calls it), with its process pool inside."""

import pytest

from data_pipeline import CorpusConfig, TokenizerConfig, TokenLoader, prepare


@pytest.mark.slow
def test_prepare_inside_a_ray_task(tmp_path, local_ray):
    ray = local_ray
    corpus, tokenizer = CorpusConfig(max_bytes=600_000), TokenizerConfig(vocab_size=600)
    remote = ray.remote(num_cpus=1)(lambda c, t, root: prepare(c, t, root, num_proc=2, progress=False))
    prep = ray.get(remote.remote(corpus, tokenizer, str(tmp_path)), timeout=300)
    assert prep == prepare(corpus, tokenizer, tmp_path, progress=False)  # same content hash: a no-op here
    assert len(prep.manifest["splits"]["train"]["shards"]) >= 1
    assert TokenLoader(prep.path, "train", 128, 4, seed=0).num_tokens == prep.manifest["splits"]["train"]["tokens"]

import pytest

from data_pipeline import CorpusConfig, TokenizerConfig, prepare


@pytest.fixture(scope="session")
def small_stdlib(tmp_path_factory):
    """The first 60 stdlib files, BPE 512: small enough to prepare in a few seconds."""
    root = tmp_path_factory.mktemp("cache")
    corpus, tokenizer = CorpusConfig(max_documents=60), TokenizerConfig(vocab_size=512)
    return prepare(corpus, tokenizer, root, num_proc=1, progress=False), corpus, tokenizer, root

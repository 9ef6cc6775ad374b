import json

import pytest
from pydantic import ValidationError

from data_pipeline import CorpusConfig, MQARConfig, TokenizerConfig


def test_defaults_are_stdlib_bpe_4096_and_json_serialisable():
    c, t = CorpusConfig(), TokenizerConfig()
    assert (c.source, t.kind, t.vocab_size, t.byte_fallback) == ("stdlib", "bpe", 4096, True)
    assert 0.02 <= c.val_fraction <= 0.05
    dumped = json.loads(json.dumps({"c": c.model_dump(mode="json"), "t": t.model_dump(mode="json")}))
    assert CorpusConfig(**dumped["c"]) == c and TokenizerConfig(**dumped["t"]) == t


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"sourc": "text"}, "sourc"),
        ({"source": "text"}, "paths"),
        ({"source": "parquet", "paths": ["x"], "document_boundary": "blank_lines"}, "document_boundary"),
        ({"source": "stdlib", "val_fraction": 1.5}, "val_fraction"),
        ({"source": "hf"}, "hf_path"),
        ({"source": "mixture"}, "components"),
        ({"source": "mqar", "mqar": {"preset": "easy", "num_kv_pairs": 40}}, "num_kv_pairs"),
        ({"source": "mqar", "mqar": {"preset": "insane"}}, "preset"),
    ],
)
def test_validation_errors_name_the_field(kwargs, field):
    with pytest.raises(ValidationError) as e:
        CorpusConfig(**kwargs)
    assert field in str(e.value)


def test_tokenizer_rejects_unknown_kind():
    with pytest.raises(ValidationError, match="kind"):
        TokenizerConfig(kind="wordpiece")


def test_mqar_presets_resolve_with_overrides():
    assert MQARConfig(preset="medium").resolved()["num_kv_pairs"] == 16
    r = MQARConfig(preset="hard", seq_len=512).resolved()
    assert (r["vocab_size"], r["seq_len"], r["num_kv_pairs"]) == (8192, 512, 64)

import pytest

from data_pipeline import CorpusConfig, DataError, TokenizerConfig
from data_pipeline.encode import encode_documents
from data_pipeline.sources import load_documents
from data_pipeline.tokenizer import load_tokenizer, train_tokenizer

ODD_TEXT = "  indented\ttab\n\n\nunicode: αβγ → 東京 🙂\r\nend  "


def test_round_trip_text_ids_text(small_stdlib):
    prep, corpus, _, _ = small_stdlib
    sp = load_tokenizer(prep.tokenizer_path)
    docs = [d.text for d in load_documents(corpus)] + [ODD_TEXT]
    for text in docs:
        ids = sp.encode(text)
        assert max(ids) < prep.vocab_size
        assert sp.decode(ids) == text  # identity normalisation + byte fallback: exact


def test_line_wise_encoding_equals_whole_document(small_stdlib):
    prep, corpus, _, _ = small_stdlib
    sp = load_tokenizer(prep.tokenizer_path)
    texts = [d.text for d in load_documents(corpus)][:20] + [ODD_TEXT]
    flat, offsets = encode_documents(sp, texts, prep.eod_id, "uint16")
    for i, text in enumerate(texts):
        assert flat[offsets[i] : offsets[i + 1]].tolist() == sp.encode(text) + [prep.eod_id]


def test_eod_is_a_control_id_never_emitted_by_text(small_stdlib):
    prep, corpus, _, _ = small_stdlib
    sp = load_tokenizer(prep.tokenizer_path)
    assert sp.id_to_piece(prep.eod_id) == "</s>"
    assert prep.eod_id not in sp.encode("</s> " + load_documents(corpus)[0].text)


def test_vocab_larger_than_corpus_supports():
    with pytest.raises(DataError, match=r"source 'tiny'.*vocab_size=5000"):
        train_tokenizer(["def f(x):\n    return x\n"] * 10, TokenizerConfig(vocab_size=5000), "source 'tiny'")


def test_training_is_deterministic():
    texts = [d.text for d in load_documents(CorpusConfig(max_documents=15))]
    cfg = TokenizerConfig(vocab_size=400, max_sentences=2000)
    assert train_tokenizer(texts, cfg, "s") == train_tokenizer(texts, cfg, "s")

"""Tokenizing by space chunks gives exactly what the tokenizer gives on whole texts (issue #23's data step).

`encode_flat` and the local tokenizer's training take a shortcut for texts whose spaces all sit between two
non-space characters: each distinct space-separated chunk is tokenized once. These tests compare the
shortcut with the Rust tokenizer on whole texts and with `WordLevelTrainer`, on generated biographies and on
texts built to break it, and check that the shortcut is really taken where it applies.
"""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import normalizers, pre_tokenizers

from scalecl.data import tokenizer as T
from scalecl.data.bilingual import train_bpe_tokenizer
from scalecl.data.biography import biographies, generate_people, preset, qa_pairs

AWKWARD = [
    "", "a", " a", "What is it?\nAnswer:", " it's Bob's 1,000.5 km-long (road)!", " x y z.", " 안녕 하세요 세계 .",
    " emoji 🙂 ok", " tab\tinside words", "a\nb c", " trailing", " 'quoted' \"double\" ...", " 12ab ab12 3.14",
]
UNSAFE = ["a  b", "end ", " ", "x \ny", "x\n y", "nul\x00 here", "  two leading"]


@pytest.fixture(scope="module")
def people():
    return generate_people(preset("tiny"))


@pytest.fixture(scope="module")
def corpus(people) -> list[str]:
    qa = qa_pairs(people)
    return [" " + t for t in biographies(people)] + list(qa.prompts) + list(qa.answers) + AWKWARD + UNSAFE


def _per_text(tok, texts: list[str]) -> list[list[int]]:
    backend = tok.backend_tokenizer
    return [backend.encode(t, add_special_tokens=False).ids for t in texts]


def _assert_same(tok, texts: list[str]) -> None:
    ids, offsets = T.encode_flat(tok, texts)
    want = _per_text(tok, texts)
    assert ids.dtype == np.int64 and offsets.tolist() == np.cumsum([0] + [len(w) for w in want]).tolist()
    assert ids.tolist() == [i for w in want for i in w]


def _word_level(corpus: list[str]):
    return T.train_tokenizer(corpus)


def test_chunks_give_the_whole_texts_ids_with_the_local_tokenizer(corpus, monkeypatch) -> None:
    tok = _word_level(corpus)
    safe = [t for t in corpus if t not in UNSAFE]
    calls = []
    monkeypatch.setattr(T, "encode_plain", lambda *a: calls.append(a) or pytest.fail("fell back"))
    for block in (1, 7, T._CHUNK_BLOCK):  # blocks split texts across calls: ids and offsets must still join
        monkeypatch.setattr(T, "_CHUNK_BLOCK", block)
        _assert_same(tok, safe)
    assert not calls


def test_chunks_give_the_whole_texts_ids_with_byte_level_bpe(corpus, monkeypatch) -> None:
    """A BPE tokenizer makes chunks of several tokens (the local one makes mostly one per chunk)."""
    tok = train_bpe_tokenizer(corpus, vocab_size=300)
    safe = [t for t in corpus if t not in UNSAFE]
    assert max(len(x) for x in _per_text(tok, safe)) > max(len(t.split(" ")) for t in safe)
    monkeypatch.setattr(T, "encode_plain", lambda *a: pytest.fail("fell back"))
    _assert_same(tok, safe)


@pytest.mark.parametrize("bad", UNSAFE)
def test_a_text_that_does_not_split_at_its_spaces_falls_back_and_still_matches(corpus, bad) -> None:
    tok = _word_level(corpus)
    assert T._space_chunks([" a b", bad]) is None
    _assert_same(tok, [" a b", bad, "What is it?\nAnswer:"])


def test_tokenizers_that_normalise_or_split_otherwise_are_never_chunked(corpus) -> None:
    tok = _word_level(corpus)
    assert T._splits_at_spaces(tok.backend_tokenizer)
    backend = tok.backend_tokenizer
    backend.normalizer = normalizers.NFC()
    assert not T._splits_at_spaces(backend)
    backend.normalizer = None
    for other in (pre_tokenizers.ByteLevel(add_prefix_space=True),
                  pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                           pre_tokenizers.ByteLevel(add_prefix_space=False)]),
                  pre_tokenizers.Whitespace()):
        backend.pre_tokenizer = other
        assert not T._splits_at_spaces(backend)


@pytest.mark.parametrize("min_frequency", [1, 2, 3])
def test_training_by_chunks_gives_the_trainers_tokenizer(corpus, monkeypatch, min_frequency) -> None:
    safe = [t for t in corpus if t not in UNSAFE] + [" tie1 tie2", " tie2 tie1", " zz aa", " aa zz"]  # equal counts
    assert T._word_counts(pre_tokenizers.ByteLevel(add_prefix_space=False), safe) is not None  # the shortcut
    fast = T.train_tokenizer(safe, min_frequency=min_frequency)
    monkeypatch.setattr(T, "_word_counts", lambda *a: None)  # the trainer counts
    slow = T.train_tokenizer(safe, min_frequency=min_frequency)
    assert fast.backend_tokenizer.to_str() == slow.backend_tokenizer.to_str()
    assert len(fast) == len(slow) > len(T.SPECIAL_TOKENS)


def test_training_falls_back_to_the_trainer_on_unsafe_text(corpus) -> None:
    assert T._word_counts(pre_tokenizers.ByteLevel(add_prefix_space=False), ["a  b"]) is None
    tok = T.train_tokenizer([" a b", "a  b c"])
    assert tok.convert_ids_to_tokens(_per_text(tok, ["a  b c"])[0]) == ["a", "Ġ", "Ġb", "Ġc"]


def test_the_cached_encoding_is_the_chunked_one(corpus, tmp_path) -> None:
    tok = _word_level(corpus)
    texts = [t for t in corpus if t.startswith(" ") and t not in UNSAFE]
    docs = T.cached_encoding(tok, lambda: texts, tmp_path / "enc")
    again = T.cached_encoding(tok, lambda: pytest.fail("re-rendered"), tmp_path / "enc")
    want = _per_text(tok, texts)
    assert [d.tolist() for d in docs] == [d.tolist() for d in again] == want

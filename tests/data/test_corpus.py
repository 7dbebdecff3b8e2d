"""Corpus streaming and packing, the bilingual stand-in, and perplexity against an independent computation."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from scalecl.common.errors import ScaleclError
from scalecl.data import corpus as corpus_mod
from scalecl.data.batches import RankBatches
from scalecl.data.bilingual import (
    BilingualConfig,
    english_biographies,
    josa,
    korean_biographies,
    split_documents,
    write_corpus,
)
from scalecl.data.corpus import (
    CorpusSpec,
    PackedChunks,
    check_corpus,
    document_ids,
    eval_chunks,
    iter_texts,
)
from scalecl.data.tokenizer import encode_plain, train_tokenizer
from scalecl.evaluation.perplexity import perplexity
from scalecl.models.build import model_from_config, tiny_config

TEXTS = [f"document {i} " + " ".join(f"w{(i * 7 + j) % 23}" for j in range(i % 11)) for i in range(40)]
TEXTS[5] = ""  # an empty document still contributes its EOS
TEXTS[9] = "서울에서 태어났다. 한국어 문장."


def write_jsonl(path, texts, column="text"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({column: t, "id": i}, ensure_ascii=False) + "\n" for i, t in enumerate(texts)))
    return path


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(TEXTS)


@pytest.fixture
def folder(tmp_path):
    write_jsonl(tmp_path / "corpus" / "train.jsonl", TEXTS)
    write_jsonl(tmp_path / "corpus" / "test.jsonl", TEXTS[:7])
    return tmp_path / "corpus"


def expected_stream(tok, texts):
    return [t for ids in encode_plain(tok, texts) for t in ids + [tok.eos_token_id]]


@pytest.mark.parametrize("seq_len,doc_batch", [(5, 1), (16, 3), (7, 256)])
def test_packing_yields_exactly_the_input_tokens(folder, tok, seq_len, doc_batch):
    """Concatenated chunks are the documents' tokens + EOS in order: nothing lost, nothing repeated."""
    spec = CorpusSpec(str(folder))
    stream = expected_stream(tok, TEXTS)
    chunks = list(PackedChunks(lambda: iter_texts(spec), tok, seq_len, drop_last=False, doc_batch=doc_batch))
    assert all(len(c) == seq_len for c in chunks[:-1]) and 1 <= len(chunks[-1]) <= seq_len
    assert torch.cat(chunks).tolist() == stream
    full = list(PackedChunks(lambda: iter_texts(spec), tok, seq_len, drop_last=True, doc_batch=doc_batch))
    assert torch.cat(full).tolist() == stream[: len(stream) // seq_len * seq_len]  # training drops only the tail
    assert eval_chunks(spec, tok, seq_len)[-1].tolist() == chunks[-1].tolist()


def test_bos_is_prepended_when_distinct_from_eos(tok):
    tok = train_tokenizer(TEXTS)
    tok.bos_token = "<unk>"
    ids = document_ids(tok, ["w1 w2", ""])
    assert ids[0].tolist()[0] == tok.bos_token_id and ids[0].tolist()[-1] == tok.eos_token_id
    assert ids[1].tolist() == [tok.bos_token_id, tok.eos_token_id]


def test_one_code_path_for_folder_file_and_text_lines(tmp_path, folder):
    """A folder of split files, a single jsonl/parquet file and a .txt file (one document per line) all stream."""
    import pandas as pd

    assert list(iter_texts(CorpusSpec(str(folder)))) == TEXTS
    assert list(iter_texts(CorpusSpec(str(folder), split="test"))) == TEXTS[:7]
    assert list(iter_texts(CorpusSpec(str(folder / "train.jsonl"), skip=3, take=4))) == TEXTS[3:7]
    pd.DataFrame({"body": TEXTS}).to_parquet(tmp_path / "c.parquet")
    assert list(iter_texts(CorpusSpec(str(tmp_path / "c.parquet"), text_column="body", skip=38))) == TEXTS[38:]
    (tmp_path / "c.txt").write_text("first line\nsecond line\n")
    assert list(iter_texts(CorpusSpec(str(tmp_path / "c.txt")))) == ["first line", "second line"]


def test_hub_ids_stream_through_load_dataset(monkeypatch):
    """Hub ids take the same path: load_dataset(id, name=config, split=..., streaming=True), nothing downloaded."""
    import datasets

    calls = []

    def fake(path, **kw):
        calls.append((path, kw))
        return iter([{"text": "a b"}, {"text": "c"}, {"text": "d e f"}])

    monkeypatch.setattr(datasets, "load_dataset", fake)
    spec = CorpusSpec("HuggingFaceFW/fineweb-2", name="kor_Hang", split="test", skip=1)
    assert list(iter_texts(spec)) == ["c", "d e f"]
    spec = CorpusSpec("HuggingFaceFW/fineweb-edu", name="sample-10BT", take=2)
    assert list(iter_texts(spec)) == ["a b", "c"]
    assert calls == [("HuggingFaceFW/fineweb-2", {"name": "kor_Hang", "split": "test", "streaming": True}),
                     ("HuggingFaceFW/fineweb-edu", {"name": "sample-10BT", "split": "train", "streaming": True})]


def test_training_stream_resumes_exactly_across_epochs(folder, tok):
    spec = CorpusSpec(str(folder))

    def stream():
        return PackedChunks(lambda: iter_texts(spec), tok, 16, loop=True, doc_batch=4)

    ref = stream()
    n_epoch = len(expected_stream(tok, TEXTS)) // 16
    head = [next(ref) for _ in range(n_epoch - 2)]
    state = ref.state_dict()
    tail = [next(ref) for _ in range(n_epoch + 3)]  # into the second epoch
    assert ref.epoch >= 1
    again = stream()
    again.load_state_dict(state)
    assert [c.tolist() for c in (next(again) for _ in range(len(tail)))] == [c.tolist() for c in tail]
    got = torch.cat(head + tail).tolist()  # epochs follow each other without a gap or a repeat
    assert got == (expected_stream(tok, TEXTS) * 3)[: len(got)]


def test_rank_batches_partition_the_global_batch(folder, tok):
    """Two processes with micro-batch m together see the chunks one process sees with micro-batch 2m."""
    spec = CorpusSpec(str(folder))

    def chunks():
        return PackedChunks(lambda: iter_texts(spec), tok, 8, loop=True)

    one = RankBatches(chunks(), 4)
    r0, r1 = RankBatches(chunks(), 2, world=2, rank=0), RankBatches(chunks(), 2, world=2, rank=1)
    for _ in range(5):
        a, b, c = next(one)["input_ids"], next(r0)["input_ids"], next(r1)["input_ids"]
        assert torch.equal(a, torch.cat([b, c]))
    assert r0.state_dict()["docs"] == one.state_dict()["docs"]


@pytest.mark.parametrize("make,msg", [
    (lambda p: CorpusSpec(str(p / "missing")), "does not exist"),
    (lambda p: CorpusSpec("not_a_hub_id_or_folder"), "does not exist"),
    (lambda p: CorpusSpec(str(write_jsonl(p / "t.jsonl", ["a"], column="body")), text_column="text"),
     "no text column 'text' (columns: body, id)"),
    (lambda p: CorpusSpec(str(write_jsonl(p / "e.jsonl", []))), "is empty"),
    (lambda p: CorpusSpec(str((p / "d").mkdir() or p / "d")), "is empty"),
    (lambda p: CorpusSpec(str(write_jsonl(p / "f" / "train.jsonl", ["a"]).parent), split="test"), "Bad split"),
    (lambda p: CorpusSpec(str(write_jsonl(p / "s.jsonl", ["a"])), skip=1), "is empty"),
])
def test_bad_corpora_fail_with_one_clear_error(tmp_path, make, msg):
    with pytest.raises(ScaleclError, match=None) as e:
        check_corpus(make(tmp_path))
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_no_scored_token_is_an_error(tmp_path, tok):
    spec = CorpusSpec(str(write_jsonl(tmp_path / "one.jsonl", [""])))
    with pytest.raises(ScaleclError, match="no tokens to score"):
        eval_chunks(spec, tok, 8)


def test_unknown_local_paths_never_reach_the_hub(monkeypatch):
    import datasets

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("went to load_dataset"))
    for path in ("./nope/data", "/abs/nope", "a/b/c", "plainname"):
        with pytest.raises(ScaleclError, match="does not exist"):
            corpus_mod._load(CorpusSpec(path))


# ---------------------------------------------------------------------------------------------------------
# the offline bilingual stand-in


def test_korean_particles_follow_the_final_consonant():
    assert [josa(w, "은") for w in ("김민준", "박지우")] == ["은", "는"]
    assert [josa(w, "이") for w in ("최서연", "박지우")] == ["이", "가"]
    assert [josa(w, "을") for w in ("수학", "카이스트")] == ["을", "를"]
    assert [josa(w, "으로") for w in ("부산", "서울", "대구")] == ["으로", "로", "로"]  # ㄹ takes 로
    assert [josa(w, "이다") for w in ("1952년 5월 28일", "누리소프트")] == ["이다", "다"]


def test_stand_in_has_two_distinct_domains_and_disjoint_splits(tmp_path):
    cfg = BilingualConfig(people=40, heldout=10, texts=2, base_korean=5)
    en, ko = english_biographies(cfg), korean_biographies(cfg)
    assert len(en) == 80 and len(ko) == 90 and en == english_biographies(cfg) and ko == korean_biographies(cfg)

    def hangul(s):
        return sum("가" <= ch <= "힣" for ch in s)

    assert all(hangul(t) == 0 for t in en)
    assert all(hangul(t) > 0.5 * sum(ch.isalpha() for ch in t) and not any("a" <= ch.lower() <= "z" for ch in t)
               for t in ko)
    root = write_corpus(tmp_path / "bil", cfg, vocab_size=400)
    for lang, texts in (("en", en), ("ko", ko)):
        splits = split_documents(texts, cfg, lang)
        assert sorted(splits["train"] + splits["test"] + splits.get("base", [])) == sorted(texts)
        for split in ("train", "test"):
            assert list(iter_texts(CorpusSpec(str(root / lang), split=split))) == splits[split]
    ko_parts = split_documents(ko, cfg, "ko")

    def names(split):  # a Korean name is 3 syllables
        return {t.split()[0][:3] for t in ko_parts[split]}

    assert not names("test") & names("train") and not names("base") & (names("train") | names("test"))
    base = list(iter_texts(CorpusSpec(str(root / "base"))))  # the base's corpus: English train + other Korean
    assert sorted(base) == sorted(split_documents(en, cfg, "en")["train"] + ko_parts["base"])
    splits = json.loads((root / "corpus.json").read_text())["splits"]
    assert splits["ko/test"]["documents"] == 20 and splits["base/train"]["documents"] == 60 + 10


# ---------------------------------------------------------------------------------------------------------
# perplexity


@pytest.mark.parametrize("arch", ["llama", "gpt_neox"])
def test_perplexity_is_exp_of_the_mean_token_nll(arch):
    model = model_from_config(tiny_config(arch, vocab_size=50), seed=1)
    g = torch.Generator().manual_seed(0)
    chunks = [torch.randint(0, 50, (12,), generator=g) for _ in range(7)] + [torch.randint(0, 50, (5,), generator=g)]
    total, count = 0.0, 0
    with torch.no_grad():
        for c in chunks:  # one sequence at a time, straight from the logits
            logp = F.log_softmax(model(c[None]).logits[0].double(), dim=-1)
            total -= logp[torch.arange(len(c) - 1), c[1:]].sum().item()
            count += len(c) - 1
    for bs in (1, 3, 16):
        r = perplexity(model, chunks, batch_size=bs)
        assert r["tokens"] == count == 7 * 11 + 4 and r["sequences"] == 8 and r["seq_len"] == 12
        assert r["nll"] == pytest.approx(total / count, rel=1e-6)
        assert r["ppl"] == pytest.approx(math.exp(total / count), rel=1e-6)

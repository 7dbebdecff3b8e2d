"""Legends and tables say what tells settings apart in words: never a raw dotted config key ('eval.final_take=0')
nor a hash. Synthetic result folders."""

from __future__ import annotations

import json
import re

from scalecl.experiments.reports import BIO_REPORT
from scalecl.report import Plot, load_runs, summary_table
from scalecl.report.runs import dotted_json, setting_parts
from tests.report.test_replicates import bio_run, write_result

RAW_KEY = re.compile(r"\b[a-z_]+\.[a-z_]+\b")  # a dotted config key such as eval.final_take


def edit(d, change):
    r = json.loads((d / "result.json").read_text())
    change(r)
    write_result(d, r)


def test_setting_parts_say_config_keys_in_words():
    flat = dotted_json({"eval": {"every": 15, "final_take": 0, "final_context": 2048}, "train": {"seq_len": 128}})
    keys = ["eval.every", "eval.final_context", "eval.final_take", "train.seq_len"]
    assert setting_parts(flat, keys) == ["evaluated every 15 steps", "whole sets also at 2,048 tokens",
                                         "whole held-out sets", "train seq len 128"]
    assert setting_parts(dotted_json({"eval": {"every": 0, "final_take": 40}}), ["eval.every", "eval.final_take"]) == [
        "evaluated only at the start and end", "first 40 held-out docs"]
    older = dotted_json({"eval": {"every": 15}})  # a run made before the whole-set evaluation existed
    assert setting_parts(older, keys[:3]) == ["evaluated every 15 steps",
                                              "whole-set length, whole-set evaluation not recorded"]
    assert setting_parts(dotted_json({"stage3": {"steps": 10, "lr": 1e-4}}), ["stage3.lr", "stage3.steps"]) == [
        "stage-3 lr 0.0001", "10 stage-3 steps"]
    opts = dotted_json({"tau": 0.5, "l_fp": None, "targets": ["attn", "mlp"]})
    assert setting_parts(opts, ["l_fp", "targets", "tau", "router"], options=True) == [
        "l_fp=auto", "targets=attn+mlp", "tau=0.5", "router=default"]


def test_tables_of_settings_that_differ_in_config_keys_name_them_in_words(tmp_path):
    """Two FFT settings: one run evaluated every 15 steps with no whole-set record (older), one at the start and
    end with the whole held-out sets at 2,048 tokens: the setting column says so, with no dotted key."""
    older = bio_run(tmp_path, "fft", 0)
    newer = bio_run(tmp_path, "fft", 1)
    edit(older, lambda r: r["config"]["eval"].update(every=15))
    edit(newer, lambda r: r["config"]["eval"].update(every=0, final_take=0, final_context=2048))
    settings = sorted(load_runs(Plot.of(tmp_path), BIO_REPORT)["setting"])
    assert settings == ["evaluated every 15 steps, whole-set length, whole-set evaluation not recorded",
                        "evaluated only at the start and end, whole sets also at 2,048 tokens, whole held-out sets"]
    table = summary_table(Plot.of(tmp_path), BIO_REPORT)
    assert not any(RAW_KEY.search(s) for s in table["setting"].fillna("")), table["setting"].tolist()


def test_settings_alike_past_the_label_are_numbered_not_hashed(tmp_path):
    """Five config keys differ but a label shows four: two settings equal in those four and in their rate are
    'variant 1' and 'variant 2', never a group hash."""
    for base, last in ((0, 1), (1, 2)):
        d = bio_run(tmp_path, "fft", base)
        edit(d, lambda r, last=last: r["config"].update(a={"k1": 1, "k2": 1, "k3": 1, "k4": 1, "k5": last}))
    d = bio_run(tmp_path, "fft", 2)
    edit(d, lambda r: r["config"].update(a={"k1": 2, "k2": 2, "k3": 2, "k4": 2, "k5": 3}))
    df = load_runs(Plot.of(tmp_path), BIO_REPORT)
    labels = sorted(df["setting"])
    assert labels[:2] == ["a k1 1, a k2 1, a k3 1, a k4 1, +1 more, variant 1",
                          "a k1 1, a k2 1, a k3 1, a k4 1, +1 more, variant 2"], labels
    assert not any(re.search(r"#[0-9a-f]{8}", s) for s in labels)


def test_outputs_name_no_folder_of_the_machine_that_made_the_run():
    """A base or data path names its file, a checkpoint its run, a cached base its entry; never the folders of the
    machine that made the run. Hub names and relative paths stay as given."""
    from scalecl.report.cpt import cpt_caption
    from scalecl.report.runs import shown_path

    assert shown_path("/home/alice/corpora/ko.txt") == ".../ko.txt"
    assert shown_path("/work/ck/cpt/real-fft-1e-4/final") == ".../real-fft-1e-4/final"
    assert shown_path("/work/real/cache/gguf/b179c9523d0e6a0f") == "gguf:b179c9523d0e6a0f"
    assert shown_path("HuggingFaceTB/SmolLM2-135M") == "HuggingFaceTB/SmolLM2-135M"
    assert shown_path("data/ko.txt") == "data/ko.txt" and shown_path("builtin") == "builtin"
    r = {"preset": "real", "config": {"base": "/home/alice/models/smollm2-135m.gguf",
                                      "data": {"path": "/home/alice/corpora/ko.txt"},
                                      "train": {"steps": 2, "batch": 1, "seq_len": 128}}}
    caption = cpt_caption(r)
    assert "/home" not in caption and "alice" not in caption
    assert "base .../smollm2-135m.gguf; new-domain data .../ko.txt" in caption
    assert setting_parts({"base": '"/home/alice/models/a"'}, ["base"]) == ["base .../a"]

"""A researcher's own model folder and own text files in one documented `train-cpt` command (docs/own-data.md).

What must hold: --model / --data / --old-eval / --new-eval name a plain transformers folder and three .txt files;
the held-out files are evaluated whole (their token and document counts are recorded, and equal the files'),
whatever split or slice the preset gives its own corpora; .txt is one document per line, or paragraphs with
--text-unit paragraph, and a hard-wrapped file read by line is warned about; a checkpoint written by `scalecl
upscale` trains on at its own widths, finds its base's tokenizer, and its trained model evaluates with eval-ppl
as it is; bad input is one `error:` line with nothing written.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from scalecl.cli import app
from scalecl.common.errors import ScaleclError
from scalecl.data.corpus import CorpusSpec, document_ids, run_on_share, wrap_warning
from scalecl.experiments import load_preset
from scalecl.training.record import checkpoint_dir

runner = CliRunner()
PEOPLE = 40  # documents per held-out file: more than the tiny preset's take = 30, which must not apply


@pytest.fixture(scope="module")
def own(tmp_path_factory) -> Path:
    """A plain transformers folder (a tiny Llama from a config, a BPE trained here, save_pretrained) and three
    text files of one document per line: new-domain training text, old- and new-domain held-out text."""
    from scalecl.data.bilingual import (
        BilingualConfig,
        english_biographies,
        korean_biographies,
        train_bpe_tokenizer,
    )
    from scalecl.models.build import model_from_config, tiny_config

    root = tmp_path_factory.mktemp("own")
    cfg = BilingualConfig(people=PEOPLE * 2, heldout=PEOPLE, texts=1)
    en, ko = english_biographies(cfg), korean_biographies(cfg)
    tok = train_bpe_tokenizer(en + ko, vocab_size=400)
    config = tiny_config("llama", vocab_size=len(tok), max_position_embeddings=64, eos_token_id=tok.eos_token_id)
    model_from_config(config, seed=0).save_pretrained(root / "my-model")
    tok.save_pretrained(root / "my-model")
    (root / "data").mkdir()
    for name, docs in (("new_train", ko[:PEOPLE]), ("old_test", en[PEOPLE:]), ("new_test", ko[PEOPLE:2 * PEOPLE])):
        assert all("\n" not in d for d in docs)
        (root / "data" / f"{name}.txt").write_text("".join(d + "\n" for d in docs))
    return root


def cli(*args: str, cwd: Path | None = None, monkeypatch=None):
    if cwd is not None:
        monkeypatch.chdir(cwd)
    return runner.invoke(app, list(args))


def train_args(tmp: Path, *extra: str) -> list[str]:
    """train-cpt on the tiny preset, a few steps, everything written under `tmp`."""
    return ["train-cpt", "--preset", "tiny", "--out", str(tmp / "out"), "--cache", str(tmp / "cache"),
            "--checkpoints", str(tmp / "runs"), "--set", "train.steps=2", "--set", "eval.every=0", *extra]


def file_tokens(path: Path, tokenizer) -> tuple[int, int]:
    """(documents, tokens packed) of a one-document-per-line file, counted here: [bos] + tokens + [eos] per line."""
    lines = path.read_text().splitlines()
    return len(lines), sum(len(ids) for ids in document_ids(tokenizer, lines))


def results(out: Path) -> dict[str, dict]:
    return {r["method"]: r for r in (json.loads(p.read_text()) for p in out.glob("*/result.json"))}


def test_one_command_trains_own_model_on_own_files_and_scores_the_whole_files(own, tmp_path):
    from scalecl.data.tokenizer import load_tokenizer

    d = own / "data"
    res = runner.invoke(app, train_args(tmp_path, "--method", "scale-route,lora", "--model", str(own / "my-model"),
                                        "--data", str(d / "new_train.txt"), "--old-eval", str(d / "old_test.txt"),
                                        "--new-eval", str(d / "new_test.txt")), terminal_width=400)
    assert res.exit_code == 0, res.output
    assert "hard-wrapped" not in res.output  # one document per line: no warning
    tok = load_tokenizer(own / "my-model")
    by = results(tmp_path / "out")
    assert sorted(by) == ["lora", "scale-route"]
    for split, name in (("old_eval", "old_test"), ("new_eval", "new_test")):
        docs, packed = file_tokens(d / f"{name}.txt", tok)
        assert docs == PEOPLE  # more than the preset's take = 30: the whole file, not the preset's slice
        for r in by.values():
            rec = r["data"][split]
            assert (rec["documents"], rec["tokens_packed"]) == (docs, packed)
            assert rec["tokens"] == packed - rec["sequences"]  # every token scored but each chunk's first
            assert r["config"][split] | {"path": ""} == {"path": "", "name": "", "split": "train",
                                                          "text_column": "text", "skip": 0, "take": 0,
                                                          "text_unit": "line"}
        assert f"{by['lora']['data'][split]['tokens']:,} tokens scored, {docs:,} documents of {d / name}.txt [train]" \
            in res.output
    assert by["scale-route"]["config"]["base"] == str(own / "my-model")
    assert by["scale-route"]["final"]["step"] == 2


def test_the_options_are_the_config_keys_and_leave_other_run_names_alone(own):
    """--data is --set data.path, and --model, resolved into a ModelSource, names the run --set base=... names:
    the run named by the options is the run named by those keys; a text unit at its default is left out of run
    names, so every run named before it keeps its name."""
    from scalecl.cli.train import model_source, own_inputs
    from scalecl.experiments.base import Paths
    from scalecl.experiments.cpt import CptExperiment
    from scalecl.experiments.sources import ModelSource

    sets = ["train.steps=3"]
    named = own_inputs({"data.path": " x.txt ", "old_eval.path": None, "new_eval.path": None}, None, sets)
    assert named == {"data": {"path": "x.txt"}}  # typed, stripped as a --set value is; never --set text
    source = model_source(f" {own / 'my-model'} ", sets)  # stripped, as a --set value is
    assert source == ModelSource("hub_or_folder", str(own / "my-model"), str(own / "my-model"))
    by_flag = CptExperiment(load_preset("cpt", "tiny", sets, inputs=named), "tiny", Paths(Path("o")), source=source)
    by_key = CptExperiment(load_preset("cpt", "tiny", [f"base={own / 'my-model'}", "data.path=x.txt", *sets]), "tiny",
                           Paths(Path("o")))
    assert by_flag.named_config() == by_key.named_config() and by_flag.rc == by_key.rc
    with pytest.raises(ScaleclError, match="data.path is given twice"):
        own_inputs({"data.path": "x.txt"}, None, ["data.path=y.txt"])
    with pytest.raises(ScaleclError, match="base is given twice"):
        model_source(str(own / "my-model"), ["base=builtin"])

    def name_of(s: list[str]) -> dict:
        return CptExperiment(load_preset("cpt", "tiny", s), "tiny", Paths(Path("o"))).named_config()

    assert "text_unit" not in json.dumps(name_of([]))
    assert name_of(["data.path=x.txt", "data.text_unit=paragraph"])["data"]["text_unit"] == "paragraph"
    assert own_inputs({"data.path": "x.txt", "old_eval.path": None}, "paragraph", ["new_eval.path=y.txt"]) == {
        "data": {"path": "x.txt", "text_unit": "paragraph"}, "new_eval": {"text_unit": "paragraph"}}


def test_a_preset_selection_never_applies_to_a_corpus_the_user_names():
    real = load_preset("cpt", "real")
    assert (real.old_eval.split, real.old_eval.take) == ("test", 16)
    named = load_preset("cpt", "real", ["old_eval.path=./old.txt"])
    assert (named.old_eval.path, named.old_eval.split, named.old_eval.take) == ("./old.txt", "train", 0)
    assert (named.new_eval.split, named.new_eval.take) == ("test", 16)  # the preset's own corpus keeps them
    limited = load_preset("cpt", "real", ["old_eval.take=5", "old_eval.path=./old.txt"])
    assert (limited.old_eval.split, limited.old_eval.take) == ("train", 5)  # the user's limit, in any order
    same = load_preset("cpt", "real", ["old_eval.path=pkg:gensim-lee-en"])
    assert (same.old_eval.split, same.old_eval.take) == ("test", 16)  # the preset's corpus named again: its slice


# ---------------------------------------------------------------------------------------------------------
# .txt: lines or paragraphs; hard-wrapped text


PROSE = ("The committee met on a Tuesday to discuss the budget for the coming year, and after a long debate "
         "about the roads, the schools and the harbour it agreed to postpone the vote until the spring. ") * 3


def test_hard_wrap_warning_fires_on_wrapped_text_only(tmp_path):
    paragraphs = [textwrap.fill(PROSE + f"Item {i} closed the meeting.", 60) for i in range(4)]
    wrapped = tmp_path / "wrapped.txt"
    wrapped.write_text("\n\n".join(paragraphs) + "\n")
    per_line = tmp_path / "per_line.txt"
    per_line.write_text("".join(" ".join(p.split()) + "\n" for p in paragraphs) * 3)
    assert run_on_share(wrapped.read_text().splitlines()) > 0.8
    assert run_on_share(per_line.read_text().splitlines()) == 0.0
    warn = wrap_warning(CorpusSpec(str(wrapped)))
    assert warn is not None and "hard-wrapped" in warn and "--text-unit paragraph" in warn and "\n" not in warn
    assert wrap_warning(CorpusSpec(str(per_line))) is None
    assert wrap_warning(CorpusSpec(str(wrapped), text_unit="paragraph")) is None  # read as paragraphs: whole
    assert str(wrapped) in wrap_warning(CorpusSpec(str(tmp_path / "*.txt")))  # a glob: the wrapped file of two
    assert run_on_share(["one line", "two"]) is None  # too few lines to say


def test_paragraphs_are_documents_with_text_unit_paragraph(own, tmp_path):
    from scalecl.data.corpus import iter_texts

    paragraphs = [textwrap.fill(PROSE + f"Item {i}.", 60) for i in range(5)]
    f = tmp_path / "wrapped.txt"
    f.write_text("\n\n".join(paragraphs) + "\n")
    assert list(iter_texts(CorpusSpec(str(f), text_unit="paragraph"))) == paragraphs
    assert len(list(iter_texts(CorpusSpec(str(f))))) == sum(p.count("\n") + 1 for p in paragraphs) + 4
    args = train_args(tmp_path, "--method", "fft", "--model", str(own / "my-model"), "--data", str(f),
                      "--old-eval", str(f), "--new-eval", str(own / "data" / "new_test.txt"), "--text-unit", "paragraph")
    res = runner.invoke(app, args, terminal_width=400)
    assert res.exit_code == 0, res.output
    (r,) = results(tmp_path / "out").values()
    assert r["data"]["old_eval"]["documents"] == 5 and r["config"]["old_eval"]["text_unit"] == "paragraph"
    assert "hard-wrapped" not in res.output
    res = runner.invoke(app, [*args[:-2], "--force"], terminal_width=400)  # the same wrapped file, line by line
    assert res.exit_code == 0, res.output
    assert "warning: data:" in res.output and "warning: old_eval:" in res.output and "hard-wrapped" in res.output
    for unit, docs in (("paragraph", 5), ("line", len(f.read_text().splitlines()))):  # eval-ppl reads the same
        ppl = runner.invoke(app, ["eval-ppl", "--model", str(own / "my-model"), "--data", str(f), "--text-unit", unit,
                                  "--json"])
        assert ppl.exit_code == 0, ppl.output
        assert json.loads(ppl.stdout)["documents"] == docs
        assert ("hard-wrapped" in ppl.stderr) == (unit == "line")


def test_globs_and_folders_of_text_files(own, tmp_path):
    from scalecl.data.corpus import iter_texts

    d = own / "data"
    texts = list(iter_texts(CorpusSpec(str(d / "*_test.txt"))))
    assert texts == (d / "new_test.txt").read_text().splitlines() + (d / "old_test.txt").read_text().splitlines()


# ---------------------------------------------------------------------------------------------------------
# a checkpoint of `scalecl upscale` as --model


def test_an_upscale_checkpoint_trains_at_its_own_widths_and_evaluates_as_is(own, tmp_path, monkeypatch):
    """`scalecl upscale` run from the model's folder's parent with a relative --model; train-cpt run from
    elsewhere finds the tokenizer of that recorded base beside the checkpoint, trains with the checkpoint's widths
    (ffn_up 16, where the tiny preset widens by 32), and eval-ppl reads the trained model with no extra flag."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "my-model").symlink_to(own / "my-model", target_is_directory=True)
    up = cli("upscale", "--model", "my-model", "--out", "up", "--variant", "route", "--hidden-up", "32",
             "--ffn-up", "16", "--l-fp", "1", cwd=work, monkeypatch=monkeypatch)
    assert up.exit_code == 0, up.output
    assert json.loads((work / "up" / "scalecl.json").read_text())["base_model"] == "my-model"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    d = own / "data"
    res = cli(*train_args(tmp_path, "--method", "scale-route", "--model", "../work/up", "--data",
                          str(d / "new_train.txt"), "--old-eval", str(d / "old_test.txt"), "--new-eval",
                          str(d / "new_test.txt")), cwd=elsewhere, monkeypatch=monkeypatch)
    assert res.exit_code == 0, res.output
    assert "scale-route: the checkpoint's own options apply: ffn_up=16 (the config gives 32)" in res.output
    (folder,) = (tmp_path / "out").iterdir()
    r = json.loads((folder / "result.json").read_text())
    assert r["method_options"]["ffn_up"] == 16 and r["method_options"]["hidden_up"] == 32
    assert Path(r["tokenizer"]).resolve() == (own / "my-model").resolve()
    final = checkpoint_dir(r, folder)
    config = json.loads((final / "config.json").read_text())
    assert (config["hidden_size"], config["intermediate_size"]) == (64 + 32, 128 + 16)  # widened once, not twice
    assert r["summary"]["old_ppl_start"] > 1
    ppl = cli("eval-ppl", "--model", str(final), "--data", str(d / "new_test.txt"), "--json")
    assert ppl.exit_code == 0, ppl.output
    rec = json.loads(ppl.stdout)
    assert rec["tokens"] == r["data"]["new_eval"]["tokens"] and rec["documents"] == PEOPLE
    assert rec["ppl"] == pytest.approx(r["summary"]["new_ppl_end"], rel=1e-5)


# ---------------------------------------------------------------------------------------------------------
# bad input: one line, nothing written


@pytest.fixture(scope="module")
def widened(own, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("widened") / "up"
    res = runner.invoke(app, ["upscale", "--model", str(own / "my-model"), "--out", str(out), "--variant", "route",
                              "--hidden-up", "32", "--ffn-up", "16", "--l-fp", "1"])
    assert res.exit_code == 0, res.output
    return out


def _bad(own: Path, widened: Path, tmp: Path, case: str) -> tuple[list[str], str]:
    d = own / "data"
    ok = ["--model", str(own / "my-model"), "--old-eval", str(d / "old_test.txt"), "--new-eval",
          str(d / "new_test.txt")]
    (tmp / "notes.docx").write_text("x\n")
    (tmp / "empty.txt").write_text("")
    return {
        "missing": ([*ok, "--data", str(tmp / "missing.txt")], "does not exist"),
        "extension": ([*ok, "--data", str(tmp / "notes.docx")], "unknown format '.docx'"),
        "empty": ([*ok, "--data", str(tmp / "empty.txt")], "is empty"),
        "glob": ([*ok, "--data", str(tmp / "nothing-*.txt")], "matches no file"),
        "mismatch": (["--model", str(widened), "--method", "lora", "--data", str(d / "new_train.txt")],
                     "is a scale-route checkpoint: it trains on as scale-route only (got --method lora)"),
        "twice": ([*ok, "--data", str(d / "new_train.txt"), "--set", "data.path=x.txt"], "given twice"),
        "unit": ([*ok, "--data", str(d / "new_train.txt"), "--text-unit", "word"], "--text-unit must be one of"),
    }[case]


@pytest.mark.parametrize("case", ["missing", "extension", "empty", "glob", "mismatch", "twice", "unit"])
def test_bad_input_is_one_line_and_writes_nothing(own, widened, tmp_path, case):
    args, msg = _bad(own, widened, tmp_path, case)
    res = runner.invoke(app, train_args(tmp_path, *args), terminal_width=400)
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:") and msg in lines[0], res.output
    assert not any((tmp_path / n).exists() for n in ("out", "cache", "runs"))


def test_paragraphs_of_a_file_that_is_not_text_are_refused(tmp_path):
    from scalecl.common.errors import ScaleclError
    from scalecl.data.corpus import check_corpus

    f = tmp_path / "rows.jsonl"
    f.write_text('{"text": "a"}\n')
    with pytest.raises(ScaleclError, match="applies to .txt text"):
        check_corpus(CorpusSpec(str(f), text_unit="paragraph"))
    with pytest.raises(ScaleclError, match="applies to .txt text"):
        load_preset("cpt", "tiny", ["old_eval.text_unit=paragraph"])  # the preset's builtin corpus


def test_a_lora_checkpoint_and_a_finished_run_train_on_as_their_method(own, tmp_path):
    """`scalecl prepare --method lora` (rank 2; the tiny preset's LoRA has rank 4) trains on as LoRA of rank 2,
    the base's tokenizer found through the checkpoint's record; that run's final model trains on again."""
    ck = tmp_path / "lora-ck"
    res = runner.invoke(app, ["prepare", "--method", "lora", "--model", str(own / "my-model"), "--set", "rank=2",
                              "--out", str(ck)])
    assert res.exit_code == 0, res.output
    d = own / "data"
    files = ["--data", str(d / "new_train.txt"), "--old-eval", str(d / "old_test.txt"), "--new-eval",
             str(d / "new_test.txt")]
    first = tmp_path / "first"
    res = runner.invoke(app, train_args(first, "--method", "lora", "--model", str(ck), *files))
    assert res.exit_code == 0, res.output
    (folder,) = (first / "out").iterdir()
    r = json.loads((folder / "result.json").read_text())
    assert r["method_options"]["rank"] == 2 and Path(r["tokenizer"]) == own / "my-model"
    assert r["trainable_params"] < r["total_params"]
    again = tmp_path / "again"
    res = runner.invoke(app, train_args(again, "--method", "lora", "--model", str(checkpoint_dir(r, folder)), *files))
    assert res.exit_code == 0, res.output
    (r2,) = results(again / "out").values()
    assert r2["method_options"]["rank"] == 2
    assert r2["summary"]["new_ppl_start"] == pytest.approx(r["summary"]["new_ppl_end"], rel=1e-5)  # where it ended

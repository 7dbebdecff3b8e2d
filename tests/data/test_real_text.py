"""Real text shipped inside PyPI wheels as corpora by name (issue #20): `pkg:konlpy-ko` (Korean: the
constitution by article and ten National Assembly bills by page, konlpy 0.6.0), `pkg:gensim-lee-en` (English
news, one article per line) and `pkg:gensim-wiki-en` (English Wikipedia articles, markup stripped; both
gensim 4.4.0), read from the installed package at run time.

Install the wheels without their dependencies (konlpy needs Java, gensim scipy; neither is imported):
``python3 -m pip install --no-deps konlpy==0.6.0 gensim==4.4.0``. Tests that read them are marked
`real_weights` and skipped where a wheel (or its exact version) is absent.
"""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

import scalecl.data.packaged as packaged
from scalecl.cli import app
from scalecl.common.errors import ScaleclError
from scalecl.data.corpus import CorpusSpec, check_corpus, iter_texts
from scalecl.experiments import load_preset
from scalecl.experiments.config import CorpusConfig
from scalecl.experiments.corpora import corpus_spec
from tests.conftest import local_sets, records, run

runner = CliRunner()

# name -> (documents, characters) of the whole corpus, then (documents, characters) of the test split
SIZES = {
    "konlpy-ko": ((198, 56_499), (39, 11_691)),
    "gensim-lee-en": ((343, 376_447), (68, 73_802)),
    "gensim-wiki-en": ((106, 2_880_801), (21, 480_611)),
}


def _installed(package: str, version: str) -> bool:
    found = packaged.package_folder(package)
    return found is not None and found[1] == version


KONLPY = _installed("konlpy", "0.6.0")
GENSIM = _installed("gensim", "4.4.0")
KONLPY_MARKS = [pytest.mark.real_weights, pytest.mark.skipif(
    not KONLPY, reason="konlpy 0.6.0 not installed (python3 -m pip install --no-deps konlpy==0.6.0)")]
GENSIM_MARKS = [pytest.mark.real_weights, pytest.mark.skipif(
    not GENSIM, reason="gensim 4.4.0 not installed (python3 -m pip install --no-deps gensim==4.4.0)")]
NEEDS = {"konlpy-ko": KONLPY_MARKS, "gensim-lee-en": GENSIM_MARKS, "gensim-wiki-en": GENSIM_MARKS}


def needs(*marks):
    """Apply marks (real_weights, the wheel's skip condition) to a test function."""
    def deco(fn):
        for m in marks:
            fn = m(fn)
        return fn
    return deco


NAMES = [pytest.param(k, marks=NEEDS[k]) for k in packaged.PACKAGED]


def _texts(name: str, split: str) -> list[str]:
    return list(iter_texts(CorpusSpec(f"pkg:{name}", split=split)))


@pytest.mark.parametrize("name", NAMES)
def test_names_resolve_through_the_corpus_mechanism(name):
    """A configured `pkg:` corpus passes the config check, corpus_spec keeps its name and `datasets` streams it."""
    for split in ("train", "test"):
        cc = CorpusConfig(path=f"pkg:{name}", split=split)
        cc.check("data.")
        spec = corpus_spec(cc, None)
        assert spec.path == f"pkg:{name}" and spec.describe() == f"pkg:{name} [{split}]"
        check_corpus(spec)
        assert len(_texts(name, split)) > 0


@pytest.mark.parametrize("name", NAMES)
def test_sizes_are_as_stated(name):
    (n, chars), (n_test, chars_test) = SIZES[name]
    docs = packaged.documents(f"pkg:{name}")
    test = _texts(name, "test")
    assert (len(docs), sum(map(len, docs))) == (n, chars)
    assert (len(test), sum(map(len, test))) == (n_test, chars_test)
    assert all(d and d == d.strip() for d in docs) and len(set(docs)) == len(docs)


@pytest.mark.parametrize("name", NAMES)
def test_split_is_deterministic_disjoint_and_every_fifth_document(name):
    docs = packaged.documents(f"pkg:{name}")
    train, test = _texts(name, "train"), _texts(name, "test")
    packaged._documents.cache_clear()  # read the package's files again
    assert _texts(name, "train") == train and _texts(name, "test") == test
    assert not set(train) & set(test) and len(train) + len(test) == len(docs)
    assert test == docs[4::5] and train == [d for i, d in enumerate(docs) if i % 5 != 4]


@needs(*KONLPY_MARKS)
def test_korean_documents_are_articles_and_bill_pages():
    docs = packaged.documents("pkg:konlpy-ko")
    assert docs[0].startswith("대한민국헌법\n유구한 역사와 전통에 빛나는 우리 대한국민은")
    assert docs[1] == "제1장 총강\n제1조 ① 대한민국은 민주공화국이다.\n②대한민국의 주권은 국민에게 있고, 모든 권력은 국민으로부터 나온다."
    assert docs[128].startswith("제10장 헌법개정\n제128조 ①")  # document i is article i; headings open it
    assert docs[131].startswith("펼침  부칙 <헌법 제10호, 1987.10.29.>  부칙보기\n제1조 이 헌법은 1988년")
    assert docs[136].startswith("제6조 이 헌법시행 당시에")  # the last supplementary article
    assert docs[137].startswith("지방공무원법 일부개정법률안\n(정의화의원 대표발의 )")  # the first bill's first page
    assert not any(line and set(line) <= set("-. ") for d in docs for line in d.split("\n"))  # no filler lines


@needs(*GENSIM_MARKS)
def test_english_documents():
    lee = packaged.documents("pkg:gensim-lee-en")
    assert lee[0].startswith("Hundreds of people have been forced to vacate their homes")
    assert sum("wearing his £3,000 sat" in d for d in lee[-50:]) == 1  # lee.cor is Latin-1, as gensim reads it
    wiki = packaged.documents("pkg:gensim-wiki-en")
    assert wiki[0].startswith("Anarchism is a political philosophy")
    assert "{{" not in wiki[0] and "[[" not in wiki[0] and "<ref" not in wiki[0]


def _missing(monkeypatch):
    monkeypatch.setattr(packaged, "package_folder", lambda package: None)


def test_missing_package_is_one_line_with_the_pip_command(monkeypatch):
    _missing(monkeypatch)
    for name, pip in (("konlpy-ko", "konlpy==0.6.0"), ("gensim-lee-en", "gensim==4.4.0")):
        with pytest.raises(ScaleclError) as e:
            check_corpus(CorpusSpec(f"pkg:{name}", split="test"))
        assert str(e.value) == (f"dataset pkg:{name} reads text shipped in {pip.replace('==', ' ')}, which is not "
                                f"installed: python3 -m pip install --no-deps {pip}")
    monkeypatch.setattr(packaged, "package_folder", lambda package: (packaged.Path("/nowhere"), "0.5.2"))
    with pytest.raises(ScaleclError, match=r"but konlpy 0\.5\.2 is installed: python3 -m pip install --no-deps "):
        packaged.documents("pkg:konlpy-ko")


def test_missing_package_on_the_command_line(monkeypatch, local, tmp_path):
    _missing(monkeypatch)
    res = runner.invoke(app, ["eval-ppl", "--model", str(local / "llama"), "--dataset", "pkg:konlpy-ko",
                              "--split", "test"])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert lines[0].startswith("error: dataset pkg:konlpy-ko") and "pip install --no-deps konlpy==0.6.0" in lines[0]
    dirs = [tmp_path / n for n in ("out", "cache", "runs")]
    sets = local_sets(local, "llama", "data.path=pkg:konlpy-ko")
    res = runner.invoke(app, ["train-cpt", "--preset", "tiny", "--method", "fft", "--out", str(dirs[0]), "--cache",
                              str(dirs[1]), "--checkpoints", str(dirs[2]), *[x for s in sets for x in ("--set", s)]])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and "pip install --no-deps konlpy==0.6.0" in lines[0], res.output
    assert not any(d.exists() for d in dirs)  # nothing written


def test_bad_names_and_splits_are_config_errors():
    with pytest.raises(ScaleclError, match=r"data\.path 'pkg:konlpy'.*pkg:konlpy-ko \(konlpy 0\.6\.0"):
        load_preset("cpt", "tiny", ["data.path=pkg:konlpy"])
    with pytest.raises(ScaleclError, match="splits train/test"):
        load_preset("cpt", "tiny", ["new_eval.path=pkg:gensim-lee-en", "new_eval.split=validation"])
    with pytest.raises(ScaleclError, match="text column 'text'"):
        check_corpus(CorpusSpec("pkg:gensim-wiki-en", text_column="body"))
    rc = load_preset("cpt", "tiny", ["data.path=pkg:konlpy-ko", "old_eval.path=pkg:gensim-lee-en", "old_eval.split=test"])
    assert (rc.data.path, rc.old_eval.path, rc.old_eval.split) == ("pkg:konlpy-ko", "pkg:gensim-lee-en", "test")


def test_help_names_the_corpora():
    res = runner.invoke(app, ["eval-ppl", "--help"], terminal_width=400)
    text = " ".join(res.output.replace("│", " ").split())
    assert all(f"pkg:{k}" in text for k in packaged.PACKAGED) and "--no-deps konlpy==0.6.0" in text


@needs(*KONLPY_MARKS)
def test_eval_ppl_on_korean_test_split(local, tmp_path):
    args = ["eval-ppl", "--model", str(local / "llama"), "--dataset", "pkg:konlpy-ko", "--split", "test",
            "--seq-len", "64", "--batch", "64", "--json"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)
    assert math.isfinite(r["ppl"]) and r["ppl"] > 1 and r["dataset"]["resolved"] == "pkg:konlpy-ko [test]"
    again = json.loads(runner.invoke(app, args).stdout)
    assert (again["ppl"], again["tokens"]) == (r["ppl"], r["tokens"])


@needs(*KONLPY_MARKS, GENSIM_MARKS[1])
def test_train_cpt_on_packaged_text(local, tmp_path):
    """train-cpt's corpora by name: Korean training text and held-out slices of both languages."""
    run(tmp_path, local_sets(local, "llama", "data.path=pkg:konlpy-ko", "new_eval.path=pkg:konlpy-ko",
                             "old_eval.path=pkg:gensim-lee-en", "old_eval.take=10", "new_eval.take=10",
                             "train.steps=2", "eval.every=0"), ["fft"])
    recs = records(tmp_path / "out", "fft")
    assert [r["step"] for r in recs] == [0, 2] and all(math.isfinite(r[k]) for r in recs
                                                      for k in ("old/ppl", "new/ppl"))

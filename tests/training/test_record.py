"""The result record (scalecl.training.record): one writer's text, one reader, the same-base rule."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest

from scalecl.common.errors import ScaleclError
from scalecl.training.record import (
    NUMBER,
    REQUIRED,
    Envelope,
    base_identity,
    checkpoint_dir,
    mistyped,
    read_record,
    record_text,
)

RESULTS = Path(__file__).resolve().parents[2] / "results"


def test_the_record_names_its_checkpoint_relative_to_the_run_folder(tmp_path):
    out, final = tmp_path / "runs" / "bio" / "r1", tmp_path / "ck" / "bio" / "r1" / "final"
    text = record_text({"name": "r1"}, {"method": "fft", "checkpoint": str(final)}, out, final)
    doc = json.loads(text)
    assert doc["run"] == {"name": "r1"} and doc["checkpoint"] == "../../../ck/bio/r1/final"
    assert str(tmp_path) not in text  # no folder of this machine
    assert checkpoint_dir(doc, out) == final


def test_a_number_that_is_not_finite_is_written_as_null_and_listed(tmp_path):
    """JSON has no NaN: a bare NaN (what json.dumps writes by default) is refused by strict readers."""
    result = {"method": "fft", "speed": {"mfu": float("nan"), "tokens_per_s": 10.0},
              "curve": [1.0, float("inf"), -float("inf")]}
    text = record_text({"name": "r1"}, result, tmp_path, None)
    doc = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} written into result.json"))
    assert doc["speed"] == {"mfu": None, "tokens_per_s": 10.0} and doc["curve"] == [1.0, None, None]
    assert doc["non_finite"] == ["speed.mfu", "curve[1]", "curve[2]"]
    assert "non_finite" not in json.loads(record_text({"name": "r1"}, {"method": "fft"}, tmp_path, None))


def test_the_reader_refuses_what_is_not_a_result_in_one_error(tmp_path):
    f = tmp_path / "result.json"
    for doc, why in (([], "JSON object"), ({"experiment": "bio", "preset": "cpu", "method": "fft"}, "'run'"),
                     ({"run": {}, "experiment": "bio", "preset": 3, "method": "fft"}, "'preset'")):
        f.write_text(json.dumps(doc))
        with pytest.raises(ScaleclError, match=why):
            read_record(f)
    f.write_text("{")
    with pytest.raises(ScaleclError, match=str(f)):
        read_record(f)


def test_every_committed_result_reads_carries_the_envelope_and_names_no_absolute_path():
    files = sorted(RESULTS.rglob("result.json"))
    assert len(files) > 100
    keys = {f.name for f in fields(Envelope)} - {"seeds"}  # CPT runs made before run seeds existed lack it
    for f in files:
        r = read_record(f)
        assert set(REQUIRED) <= set(r) and keys <= set(r), f
        ck = r.get("checkpoint")
        assert ck is None or not Path(ck).is_absolute(), f


def test_same_base_is_read_from_what_a_run_recorded():
    stages = {"stage1": {"final_loss": 0.4}, "stage2": {"final_loss": 0.1}}
    bio = {"preset": "cpu", "seeds": {"base": 1, "run": 0}, **stages}
    assert base_identity(bio) == base_identity(bio | {"seeds": {"base": 1, "run": 2}})  # run seeds share a base
    assert base_identity(bio) != base_identity(bio | {"seeds": {"base": 2, "run": 0}})
    assert base_identity({"base": {"source": "cache/cpt/base-1"}}) == ("model", "cache/cpt/base-1")
    assert base_identity({"preset": "cpu"}) is None


def test_the_reader_checks_the_type_of_each_further_key_its_caller_reads(tmp_path):
    """`fields`: a key present with another type is one error naming it; a missing key is the caller's to
    require, and null stands for an unset number (an option such as l_fp), never for an object."""
    f = tmp_path / "result.json"
    base = {"run": {}, "experiment": "bio", "preset": "cpu", "method": "fft"}
    fields = {"provenance": dict, "provenance.date": str, "lr": NUMBER, "method_options.l_fp": int}
    for extra in ({}, {"provenance": {}}, {"provenance": {"date": "x"}, "lr": 1, "method_options": {"l_fp": None}}):
        f.write_text(json.dumps(base | extra))
        assert read_record(f, fields=fields) == base | extra
    for extra, why in (({"provenance": "x"}, "'provenance' is a string, not an object"),
                       ({"provenance": None}, "'provenance' is null, not an object"),
                       ({"provenance": {"date": 1}}, "'provenance.date' is an integer, not a string"),
                       ({"lr": "1e-4"}, "'lr' is a string, not a number"), ({"lr": False}, "'lr' is true or false"),
                       ({"method_options": {"l_fp": 2.5}}, "'method_options.l_fp' is a number, not an integer")):
        f.write_text(json.dumps(base | extra))
        with pytest.raises(ScaleclError, match=f"{f}: {why}"):
            read_record(f, fields=fields)
        assert mistyped(base | extra, fields).startswith(why)

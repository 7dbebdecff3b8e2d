"""Without the hub: one probe, then one `error:` line within seconds (eval-harness, eval-ppl, train-cpt), the tasks'
data looked up in the local cache before any weights load, and lm-eval's tasks resolved from the built-in folders
that mention them as its full index resolves them.

These tests need no network: the hub is whatever this machine reaches (none here: the real offline case), or an
address that refuses connections where the hub answers; the Hugging Face cache is an empty folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scalecl.common.errors import ScaleclError

REPO = Path(__file__).resolve().parents[2]


def _unreachable_env(tmp: Path) -> dict[str, str]:
    """A process environment without hub access and with an empty Hugging Face cache."""
    from scalecl.common.hub import hub_reachable

    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_EVALUATE_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env |= {"HF_HOME": str(tmp / "hf_home"), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    if "HF_ENDPOINT" in env or hub_reachable():  # a machine with internet: a closed port stands in for the hub
        env["HF_ENDPOINT"] = "http://127.0.0.1:9"
    return env


def _run(args: list[str], env: dict[str, str], cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "scalecl_launch", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)
    return proc, time.monotonic() - t0


@pytest.mark.slow
def test_without_the_hub_every_command_fails_in_one_line_within_seconds(local, tmp_path):
    """Hub datasets, models and tokenizers: exit 2, exactly one line on stderr (no retries, no library log lines
    before it), and within 5 s of the same command failing at its first check plus what importing the libraries
    costs on this machine (the first check comes before the imports; huggingface_hub's five retries alone sleep
    23 s)."""
    env = _unreachable_env(tmp_path)
    model, data = str(local / "llama"), str(local / "corpus" / "en")
    cpt = ["train-cpt", "--preset", "tiny", "--method", "fft", "--out", str(tmp_path / "o"), "--cache",
           str(tmp_path / "c"), "--checkpoints", str(tmp_path / "k")]
    cases = {  # command: (its baseline (a missing local path), the hub cases, what each error line names)
        "eval-harness": (["eval-harness", "--model", str(tmp_path / "nothing"), "--tasks", "kobest"], [
            (["eval-harness", "--model", model, "--tasks", "kobest", "--out", str(tmp_path / "h")], "skt/kobest_v1"),
            (["eval-harness", "--model", model, "--tasks", "arc_easy", "--data-source", "hub", "--out",
              str(tmp_path / "h")], "allenai/ai2_arc"),
            (["eval-harness", "--model", model, "--tasks", "truthfulqa_mc2", "--out", str(tmp_path / "h")],
             "truthfulqa/truthful_qa")]),
        "eval-ppl": (["eval-ppl", "--model", str(tmp_path / "nothing"), "--dataset", data], [
            (["eval-ppl", "--model", model, "--dataset", "HuggingFaceFW/fineweb-edu", "--name", "sample-10BT"],
             "HuggingFaceFW/fineweb-edu"),
            (["eval-ppl", "--model", model, "--dataset", data, "--tokenizer", "HuggingFaceTB/SmolLM2-135M"],
             "HuggingFaceTB/SmolLM2-135M")]),
        "train-cpt": ([*cpt, "--set", f"data.path={tmp_path / 'nothing'}"], [
            ([*cpt, "--set", "base=HuggingFaceTB/SmolLM2-135M"], "HuggingFaceTB/SmolLM2-135M"),
            ([*cpt, "--set", "data.path=HuggingFaceFW/fineweb-edu"], "HuggingFaceFW/fineweb-edu")]),
    }
    t0 = time.monotonic()  # the arguments are checked before the libraries load: what importing them costs here
    subprocess.run([sys.executable, "-c", "import torch, transformers, datasets, peft"], env=env, check=True, timeout=300)
    imports_s = time.monotonic() - t0
    for command, (baseline, hub_cases) in cases.items():
        proc, base_s = _run(baseline, env, tmp_path)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, (command, proc.stderr)
        base_s += imports_s
        for args, name in hub_cases:
            proc, took = _run(args, env, tmp_path)
            lines = proc.stderr.splitlines()
            assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (args, proc.stderr)
            assert name in lines[0] and "cannot be reached" in lines[0], lines[0]
            assert took < base_s + 5, (args, took, base_s)


def _cached_kobest_boolq(cache: Path, rows: list[dict]) -> None:
    """skt/kobest_v1 (boolq) as `datasets` caches a hub dataset once loaded: its arrow files and dataset_info under
    <cache>/skt___kobest_v1/boolq/<version>/<hash>/, made here from local JSON (the hub's own files unreachable)."""
    import datasets

    src = cache.parent / "src"
    src.mkdir(parents=True)
    files = {}
    for split in ("train", "validation", "test"):
        (src / f"{split}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        files[split] = str(src / f"{split}.jsonl")
    built = cache.parent / "built"
    datasets.load_dataset("json", data_files=files, cache_dir=str(built))
    (folder,) = [p for p in built.glob("json/*/*/*") if p.is_dir()]
    dest = cache / "skt___kobest_v1" / "boolq" / folder.parent.name / folder.name
    shutil.copytree(folder, dest)
    info = json.loads((dest / "dataset_info.json").read_text())
    (dest / "dataset_info.json").write_text(json.dumps(info | {"config_name": "boolq", "dataset_name": "kobest_v1"}))
    for arrow in dest.glob("json-*.arrow"):
        arrow.rename(dest / arrow.name.replace("json-", "kobest_v1-"))


ROWS = [{"paragraph": "하늘 바다 사과", "question": "학교 친구", "label": i % 2} for i in range(6)]


def test_the_tasks_data_is_looked_up_in_the_cache_before_the_model_loads(tmp_path, monkeypatch):
    """Offline, a hub dataset the tasks read must be in the local cache: a miss (a dataset or a config of it
    never loaded) is one error naming the task and the dataset; a cached one passes."""
    import datasets
    import huggingface_hub.constants

    from scalecl.common import hub
    from scalecl.evaluation.harness import check_task_data, resolve_tasks

    cache = tmp_path / "datasets"
    _cached_kobest_boolq(cache, ROWS)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for module, flag in ((datasets.config, "HF_HUB_OFFLINE"), (huggingface_hub.constants, "HF_HUB_OFFLINE")):
        monkeypatch.setattr(module, flag, True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    monkeypatch.setattr(hub, "hub_off", lambda name: True)
    monkeypatch.setitem(hub._STATE, "unreachable", False)  # offline by the setting (an earlier probe may have run)
    check_task_data(*resolve_tasks("kobest_boolq"))
    with pytest.raises(ScaleclError, match=r"^task kobest_copa reads the dataset skt/kobest_v1 \(copa\): "
                                           r"skt/kobest_v1 is not .* hub access is off"):
        check_task_data(*resolve_tasks("kobest"))
    with pytest.raises(ScaleclError, match=r"^task arc_easy reads the dataset allenai/ai2_arc \(ARC-Easy\).*; 1 more "
                                           r"missing: skt/kobest_v1; fill the cache"):
        check_task_data(*resolve_tasks("arc_easy,kobest_copa"))
    # the hub reachable, but datasets offline by its own flag (HF_DATASETS_OFFLINE=1): checked all the same
    monkeypatch.setattr(hub, "hub_off", lambda name: False)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with pytest.raises(ScaleclError, match=r"not in the local Hugging Face cache, and datasets is offline"):
        check_task_data(*resolve_tasks("kobest_copa"))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)  # online: lm-eval downloads what it needs
    check_task_data(*resolve_tasks("kobest_copa"))


@pytest.mark.slow
def test_eval_harness_runs_offline_on_cached_hub_data(local, tmp_path):
    """The hub unreachable and KoBEST BoolQ in the datasets cache: the probe turns the process offline, lm-eval
    reads the cached data, the scores are written, and lm-eval's warnings come after, once each."""
    env = _unreachable_env(tmp_path) | {"HF_DATASETS_CACHE": str(tmp_path / "datasets")}
    _cached_kobest_boolq(tmp_path / "datasets", ROWS)
    proc, _ = _run(["eval-harness", "--model", str(local / "llama"), "--tasks", "kobest_boolq", "--limit", "4",
                    "--batch-size", "2", "--device", "cpu", "--bootstrap-iters", "0", "--out", str(tmp_path / "h")],
                   env, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (scores,) = (tmp_path / "h").glob("*/scores.csv")
    assert "kobest_boolq" in scores.read_text() and "Retrying" not in proc.stderr
    assert proc.stderr.count("f1 not found in the evaluate library") <= 1, proc.stderr


def test_tasks_resolve_from_the_folders_that_mention_them_as_in_the_full_index():
    """The built-in folders whose files mention the tasks (and the members of their groups and tags) define every
    name as lm-eval's full index of ~14,000 files does: the same file for each, for the paper's tasks, an English
    group and a tag."""
    from lm_eval.tasks._index import Kind

    from scalecl.evaluation.harness import _full_task_manager
    from scalecl.evaluation.harness_tasks import subset_task_manager

    full = _full_task_manager(()).task_index
    for names in (["kobest_boolq", "kobest_copa", "kobest_hellaswag"],
                  ["arc_challenge", "hellaswag", "mmlu", "truthfulqa_mc2", "winogrande"], ["ai2_arc", "arc_easy"]):
        sub = subset_task_manager(names, []).task_index
        todo, seen = list(names), set()
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            assert sub[name].kind == full[name].kind and sub[name].yaml_path == full[name].yaml_path, name
            if full[name].kind == Kind.GROUP:
                todo += [t for t in full[name].cfg.get("task", []) if isinstance(t, str)]
            elif full[name].kind == Kind.TAG:
                assert sub[name].tags == full[name].tags, name
                todo += sorted(full[name].tags)
        assert len(seen) >= len(names)
        assert len(sub) < len(full) / 10  # a small part of the index

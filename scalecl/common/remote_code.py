"""Code in a model or tokenizer folder never runs.

A transformers folder may name Python files of its own in its config.json or tokenizer_config.json (`auto_map`).
transformers imports them when told to trust them and, when not told, asks on stdin, so that a script piping
`yes` into a command would answer for the user. Every transformers load of a path or hub id the suite is given
passes `trust_remote_code=False` (`NO_REMOTE_CODE`): transformers then takes its own class for a family it ships
and refuses anything else, without asking. SCALE checkpoints, which carry scalecl's model code beside their
weights for plain transformers users, load through scalecl's own classes (scalecl.modeling), never through the
copy in the folder. Nothing here imports transformers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

# the keyword every transformers from_pretrained of the suite passes (tests/common/test_remote_code.py checks)
NO_REMOTE_CODE: dict[str, Any] = {"trust_remote_code": False}

_MAPPED_FILES = ("config.json", "tokenizer_config.json")


def named_code(source: str | os.PathLike) -> list[str]:
    """What a folder's config.json and tokenizer_config.json map to code of their own (`auto_map`), one
    "file: module.Class, ..." string per file; [] for a hub id, a file, or a folder that names none."""
    folder = Path(source).expanduser()
    found = []
    for name in _MAPPED_FILES if folder.is_dir() else ():
        try:
            doc = json.loads((folder / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        mapped = doc.get("auto_map") if isinstance(doc, dict) else None
        values = mapped.values() if isinstance(mapped, dict) else ()
        targets = [t for v in values for t in (v if isinstance(v, list) else [v]) if isinstance(t, str)]
        if targets:
            found.append(f"{name}: {', '.join(dict.fromkeys(targets))}")
    return found


def is_refusal(e: BaseException) -> bool:
    """Whether a transformers error is its refusal to run a folder's own code (trust_remote_code=False)."""
    return isinstance(e, ValueError) and "trust_remote_code=True" in str(e)


def refusal_line(source: str | os.PathLike, what: str = "model") -> str:
    """The one error line for a model or tokenizer (`what`) that loads only by running code that came with it."""
    names = named_code(source)
    named = f" ({'; '.join(names)})" if names else ""
    instead = "a tokenizer saved by transformers (tokenizer.json)" if "tokenizer" in what else \
        "a model of a family transformers ships"
    return (f"{what} {source} loads only by running Python code that came with it{named}; scalecl never runs code "
            f"from a model or tokenizer folder: give {instead}")

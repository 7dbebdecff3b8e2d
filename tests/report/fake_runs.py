"""Hand-made run folders for `scalecl plot` tests: result.json written the way a run writes it (record_text,
recorded with its fingerprint in the run folder's manifest, scalecl.common.files.OwnedFiles), so that plot
trusts it as it trusts a finished run."""

from __future__ import annotations

from pathlib import Path

from scalecl.common.files import OwnedFiles
from scalecl.training.record import RESULT_FILE, record_text
from scalecl.training.run import RUN_WRITER


def write_result(d: Path, result: dict) -> Path:
    """`d/result.json` holding `result` as the run writer writes it (replacing one it wrote before)."""
    d = Path(d)
    return OwnedFiles(d, RUN_WRITER).write(RESULT_FILE, record_text({"name": d.name}, result, d, None))

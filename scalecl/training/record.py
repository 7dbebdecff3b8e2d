"""The result record of a finished run, `<run>/result.json`: its declared shape, the one writer and the one
reader, and what end-of-run tables compare a run with (the FFT run of the same base, the chance floor).

Every experiment's record carries the `Envelope` keys plus its own (the biography: stages, priors, vocabulary
rows; continual pre-training: the base, the corpora). `run` is the identity the run was named by
(scalecl.training.run.Run.identity). A record names no folder of the machine that wrote it: `checkpoint` is
the final model's folder relative to the run folder. A record is strict JSON: a number that is not finite (NaN,
infinity) is written as null, and the record's `non_finite` lists where.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scalecl.common.errors import ScaleclError
from scalecl.common.readers import read_json
from scalecl.models.gguf import base_name

RESULT_FILE = "result.json"
REFERENCE_WRITER = "scalecl study"  # a study's reference.json to a run it did not train: its folder's manifest
# what makes a file a scalecl result at all; the rest is each reader's to require
REQUIRED = {"run": dict, "experiment": str, "preset": str, "method": str}
NUMBER = (int, float)  # a JSON number (true and false are not numbers here)
Fields = Mapping[str, type | tuple[type, ...]]  # dotted path -> its type where present


@dataclass
class Envelope:
    """The keys every experiment's result.json carries, declared once."""

    experiment: str  # the experiment's registered name (scalecl.experiments.EXPERIMENTS)
    preset: str
    method: str
    method_options: dict[str, Any]
    description: str  # the method's one-line description (Method.describe)
    lr: float  # the rate the method trained at (after any per-method scale)
    seeds: dict[str, int]  # {"base": ..., "run": ...}
    trainable_params: int
    total_params: int
    config: dict[str, Any]  # the whole resolved config (asdict)
    provenance: dict[str, Any]  # scalecl.compute.machine.provenance at the start, plus "finished"
    processes: int
    speed: dict[str, Any]
    summary: dict[str, Any] = field(default_factory=dict)  # the end-of-run table's numbers
    final: dict[str, Any] = field(default_factory=dict)  # the last evaluation

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def params(model) -> dict[str, int]:
    """Trainable and total parameter counts of a trained model, as the envelope records them."""
    return {"trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "total_params": sum(p.numel() for p in model.parameters())}


def record_text(identity: dict[str, Any], result: dict[str, Any], out_dir: Path, final_dir: Path | None) -> str:
    """The text of result.json: the run's identity, then the result, with the final model's folder relative to
    the run folder (the caller's dict keeps the path it can open). Strict JSON: a number that is not finite is
    written as null and its key listed under `non_finite` (finite_json)."""
    doc = {"run": identity} | result
    if final_dir is not None and "checkpoint" in result:
        doc["checkpoint"] = Path(os.path.relpath(Path(final_dir).absolute(), Path(out_dir).absolute())).as_posix()
    found: list[str] = []
    doc = finite_json(doc, found)
    if found:
        doc["non_finite"] = found
    return json.dumps(doc, indent=2, default=str, allow_nan=False) + "\n"


def finite_json(obj: Any, found: list[str], where: str = "") -> Any:
    """`obj` with every float that is not finite replaced by None, its key path ("speed.mfu") added to `found`.

    JSON has no NaN or Infinity: json.dumps would write a bare NaN, which strict readers (JSON.parse, jq) refuse.
    A result is not thrown away for one such number (an evaluation that is not finite stops the run before any
    record, scalecl.training.fit), so it is kept as null, and `non_finite` says which keys were so written."""
    if isinstance(obj, float) and not math.isfinite(obj):
        found.append(where or "(the record)")
        return None
    if isinstance(obj, dict):
        return {k: finite_json(v, found, f"{where}.{k}" if where else str(k)) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite_json(v, found, f"{where}[{i}]") for i, v in enumerate(obj)]
    return obj


def read_record(f: Path, what: str = "run result", identity: bool = True,
                fields: Fields | None = None) -> dict[str, Any]:
    """A result.json as a dict, or one ScaleclError naming the file: unreadable, not an object, lacking a key
    every result has (REQUIRED; `identity=False` leaves out `run`, for tables drawn from results made elsewhere),
    or holding one of `fields` (further keys the caller reads) with another type (mistyped)."""
    r = read_json(f, what)
    if not isinstance(r, dict):
        raise ScaleclError(f"{what} {f}: not a scalecl result (a JSON object is expected)")
    for key, kind in REQUIRED.items():
        if (identity or key != "run") and not isinstance(r.get(key), kind):
            raise ScaleclError(f"{what} {f}: not a scalecl result (no {key!r})")
    wrong = mistyped(r, fields or {})
    if wrong is not None:
        raise ScaleclError(f"{what} {f}: {wrong}")
    return r


_MISSING = object()
_KIND_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number",
               bool: "true or false"}


def _kind_name(kinds: tuple[type, ...]) -> str:
    return "a number" if set(kinds) == set(NUMBER) else " or ".join(_KIND_NAMES.get(k, k.__name__) for k in kinds)


def mistyped(r: dict[str, Any], fields: Fields) -> str | None:
    """The first of `fields` (a dotted path -> its type; a parent path listed before its children) that `r` holds
    with another type, as "'provenance' is a string, not an object"; None when each one present has its type.
    A missing key is each reader's to require; null stands for an unset number or flag (an option such as
    l_fp), never for an object, a list or a string. A reader that checks every key it reads this way turns a
    result edited by hand into one line, never a traceback."""
    for path, kind in fields.items():
        v: Any = r
        for k in path.split("."):
            v = v.get(k, _MISSING) if isinstance(v, dict) else _MISSING
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if v is _MISSING or (v is None and not {dict, list, str} & set(kinds)):
            continue
        if not (isinstance(v, kinds) and (bool in kinds or not isinstance(v, bool))):
            return f"{path!r} is {'null' if v is None else _kind_name((type(v),))}, not {_kind_name(kinds)}"
        if isinstance(v, float) and not math.isfinite(v):  # NaN or Infinity: JSON a writer of the suite never makes
            return f"{path!r} is {v}, not a finite number"
    return None


def checkpoint_dir(result: dict[str, Any], run_dir: Path) -> Path | None:
    """The final model's folder a record names (relative to its run folder, or as older records wrote it)."""
    ck = result.get("checkpoint")
    if not isinstance(ck, str) or not ck:
        return None
    return Path(ck) if Path(ck).is_absolute() else Path(os.path.normpath(run_dir / ck))


# ---------------------------------------------------------------------------------------------------------
# what a result is compared with


def base_identity(result: dict[str, Any]) -> tuple | None:
    """What a finished run started from, read from what it recorded: a base model (`base.source`, continual
    pre-training), or cached stages 1-2 (the base seed and the stages' final losses, which differ between any
    two cache entries; the biography). None if the record says neither."""
    base = result.get("base")
    if isinstance(base, dict) and isinstance(base.get("source"), str) and base["source"]:
        # a cached base by its entry, wherever the cache was; one that was trained also by its final loss, which
        # differs between two builds of one entry (another CPU type rounds differently)
        loss = base.get("final_loss")
        return ("model", base_name(base["source"]), *([loss] if isinstance(loss, float) else []))
    stages = [result.get(s) for s in ("stage1", "stage2")]
    if not all(isinstance(s, dict) and "final_loss" in s for s in stages):
        return None
    seeds = result.get("seeds") if isinstance(result.get("seeds"), dict) else {}
    return ("stages", result.get("preset"), seeds.get("base", 0), *(s["final_loss"] for s in stages))


def fft_reference(results: list[dict[str, Any]], folders: Sequence[Path]) -> dict[str, Any] | None:
    """The FFT run of the same base as the sweep's runs: among them, else a finished one in the first of
    `folders` that has one (the newest there); None when there is none or the runs do not share one base."""
    bases = {base_identity(r) for r in results}
    if len(bases) != 1 or None in bases:
        return None
    base = bases.pop()
    found = [r for r in results if r.get("method") == "fft"]
    for folder in folders:
        if found:
            break
        found = _finished_fft(folder, base)
    return max(found, key=_finished) if found else None


def _finished_fft(out: Path, base: tuple) -> list[dict[str, Any]]:
    """The finished FFT runs of `base` in the folder `out` (none when it does not exist)."""
    found: list[dict[str, Any]] = []
    if out.is_dir():
        for f in out.glob(f"*fft*/{RESULT_FILE}"):
            try:
                r = read_record(f)
            except ScaleclError:  # a damaged result is `scalecl plot`'s to report, not the summary's
                continue
            if r.get("method") == "fft" and base_identity(r) == base:
                found.append(r)
    return found


def _finished(result: dict[str, Any]) -> str:
    prov = result.get("provenance") if isinstance(result.get("provenance"), dict) else {}
    return str(prov.get("finished") or prov.get("date") or "")


def chance_floor(results: list[dict[str, Any]], part: str) -> float | None:
    """The accuracy of always answering an attribute's most common first token (`priors`, pooled over attributes)
    on `part` (task0_heldout, task1), if the runs record one and agree on it."""
    floors = {r.get("priors", {}).get(part, {}).get("pooled") for r in results}
    return floors.pop() if len(floors) == 1 and None not in floors else None

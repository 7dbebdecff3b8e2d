"""Reading results folders: result.json and metrics files into frames of runs, their replicate groups (runs of
one setting that differ only in their seeds), and what a figure or table says about the runs it used. Every
reader records a run it leaves out (a file missing or malformed, a result its run folder's manifest does not
prove) in the Plot it is given, instead of failing."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import pandas as pd

from scalecl.common.errors import ScaleclError
from scalecl.common.files import OwnedFiles, proves
from scalecl.common.readers import read_json, read_jsonl
from scalecl.common.schema import named_dict, without
from scalecl.methods.base import METHOD_ORDER
from scalecl.models.gguf import base_name
from scalecl.report.context import Plot
from scalecl.report.continual import with_cl
from scalecl.report.spec import ReportSpec
from scalecl.training.record import NUMBER, REFERENCE_WRITER, Fields, base_identity, mistyped, read_record
from scalecl.training.run import RUN_WRITER

LABELS = {"fft": "FFT", "lora": "LoRA", "freeze": "Freeze", "llama-pro": "LLaMA Pro", "scale-preserve": "SCALE-Preserve",
          "scale-adapt": "SCALE-Adapt", "scale-route": "SCALE-Route"}


def _study_of(f: Path) -> str | None:
    """The study a result belongs to: the folder after the last 'studies' in its path (.../studies/<study>/<run>)."""
    parts = f.resolve().parts[:-2]
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] == "studies" and i + 1 < len(parts):
            return parts[i + 1]
    return None


# What the report reads of any result besides its experiment's ReportSpec paths, with the type each must have
# where present (parents before children): a result holding another is skipped with one line, not a traceback.
RESULT_FIELDS: Fields = {
    "provenance": dict, "provenance.date": str, "provenance.finished": str, "seeds": dict, "lr": NUMBER,
    "config": dict, "config.model": dict, "config.model.vocab": int, "config.model.layers": int,
    "config.compute": dict, "method_options": dict, "method_options.tau": NUMBER, "method_options.router": str,
    "method_options.l_fp": NUMBER, "summary": dict, "final": dict, "priors": dict, "data": dict, "base": dict,
    "base.source": str, "vocab": dict, "vocab.model": int, "vocab.tokenizer": int, "stage1": dict,
    "stage2": dict, "never_target_rows": int,
}


def read_result(f: Path) -> dict:
    """A result.json (scalecl.training.record.read_record: an object naming its experiment, preset and method,
    every RESULT_FIELDS key it holds of its type), or one clear error naming the file."""
    try:
        r = read_record(f, "unreadable result", identity=False, fields=RESULT_FIELDS)
        bad = _non_finite(r.get("summary"), "summary") or _non_finite(r.get("final"), "final")
        if bad:  # the suite writes null for a number that is not finite: NaN or Infinity here was written by hand
            raise ScaleclError(f"unreadable result {f}: {bad!r} is not a finite number")
        return r
    except ScaleclError as e:
        raise ScaleclError(f"{e}; remove its run folder or rerun it") from None


def _non_finite(v: Any, path: str) -> str | None:
    """The first path under `v` holding NaN or an infinity, or None."""
    if isinstance(v, float) and not math.isfinite(v):
        return path
    if isinstance(v, dict):
        return next((b for k, x in v.items() if (b := _non_finite(x, f"{path}.{k}"))), None)
    if isinstance(v, list):
        return next((b for i, x in enumerate(v) if (b := _non_finite(x, f"{path}[{i}]"))), None)
    return None


def spec_fields(spec: ReportSpec) -> dict:
    """The types an experiment's results must have where the report reads them: its declared `fields`, and a
    number at every other path its tables and frontier read (required, metrics, paired, frontier)."""
    paths = [*spec.required, *(p for _, p, _ in spec.metrics), *(p for _, p in spec.paired),
             spec.frontier.x[1], spec.frontier.y[1]]
    declared = {**RESULT_FIELDS, **spec.fields}
    return {**spec.fields, **{p: NUMBER for p in paths if p not in declared}}


def _lacks(r: dict, keys: tuple[str, ...]) -> str | None:
    """The first of `keys` (dotted paths) that the result lacks, or None."""
    return next((path for path in keys if value_at(r, path) is None), None)


UNVERIFIED = "unverified"  # the key plot --unverified adds to a result its run's manifest does not prove: why


def unproven(f: Path) -> str | None:
    """Why the manifest of its run folder does not prove `f` is the result its run wrote, unchanged; None when it
    does. The rule training applies before a result.json marks a run finished (scalecl.training.run.Run.result:
    the run writer's scalecl.common.files.OwnedFiles), so that plot draws exactly the runs training trusts."""
    record = ".scalecl-run-files.json"  # OwnedFiles(<run folder>, RUN_WRITER).manifest
    try:
        files = OwnedFiles(f.parent, RUN_WRITER)
    except ScaleclError:
        return f"{record} beside it is not the record of the files a run wrote"
    if f.is_symlink():
        return "a symbolic link, not the file its run wrote"
    if not files.manifest.exists():
        return f"no {record} beside it records that a run wrote it (made or copied by hand?)"
    if f.name not in files.files:
        return f"{record} beside it does not record it"
    if not files.owns(f.name):
        return f"changed since its run wrote it (its fingerprint in {record} differs)"
    return None


# the key plot adds to a result read from a results folder after the first (`--results`, in order; plot's default
# reads results/, the committed runs, first, then runs/): drawn as a setting of its own, marked '(yours)'
YOURS = "yours"


def marks(r: dict) -> list[str]:
    """What keeps a result's runs apart from the others' and is said in its labels: 'unverified' (drawn with plot
    --unverified), 'yours' (from a results folder after the first)."""
    return [m for m in (UNVERIFIED, YOURS) if r.get(m)]


def marked(label: str, r: dict) -> str:
    """A label of a result said to be unverified or from a later results folder: '<label> (unverified)',
    '<label> (yours)'."""
    tags = ", ".join(marks(r))
    if not tags:
        return label
    return f"{label} ({tags})" if label else tags


def _result_or_none(plot: Plot, f: Path) -> dict | None:
    """read_result of a result its run folder's manifest proves (unproven); None with the file recorded as
    skipped when it is unreadable or unproven (with plot.unverified, unproven ones are returned marked)."""
    try:
        r = read_result(f)
    except ScaleclError as e:
        plot.skip(f, str(e))
        return None
    r.pop(UNVERIFIED, None)
    r.pop(YOURS, None)
    why = unproven(f)
    if why is not None and not plot.unverified:
        plot.skip(f, f"{f}: {why}; not a finished run to training either (plot --unverified draws it, marked so)")
        return None
    if why is not None:
        r[UNVERIFIED] = why
    return r


RUN_COLUMNS = ["dir", "preset", "method", "date", "result", "base_seed", "run_seed", "group", "pair", "base_build",
               "replaces"]
SEED_KEYS = ("seed", "run_seed")  # what replicates of one setting differ in
# per-method tables of a config: runs of other methods differ there; and the biography's ensemble control, a
# treatment of a method's run on the same base (runs that differ only there pair)
METHOD_KEYS = ("methods", "lr_scale", "lr", "ensemble")


def load_runs(plot: Plot, spec: ReportSpec, study: str | None = None) -> pd.DataFrame:
    """One row per finished run (result.json) of an experiment, with its replicate group and seeds.

    Main runs: replicates are kept. A replicate group is (experiment, preset, method, method options, config
    without its seeds) (`group`, a short hash, and `setting`, what tells it from the preset's other groups);
    `pair` names the runs that share a base: same experiment, preset and config outside the seeds and the
    per-method tables. Study sweeps live under `.../studies/<study>/`: they are left out of the main figures and,
    with `study=`, loaded alone (one row per run, each its own group, since their options differ).
    Every results folder of the plot is read, in order. A run from a folder after the first is marked 'yours'
    (marked): a group of its own, never averaged with the first folder's runs. Of runs of one setting with the
    same seeds one is drawn: the first folder's (within a folder, the newest); each run left out for it is
    recorded as skipped (one line, naming the run drawn instead) and in `replaces` of the run kept (inputs_text).
    Read once per plot, experiment and study; each call gets its own copy of the table and of each result's top
    level (the figures read results, none changes one).
    """
    key = (id(spec), study)
    if key not in plot.loaded:
        plot.loaded[key] = (spec, _read_runs(plot, spec, study))  # the spec kept, so that its id stays its own
    df = plot.loaded[key][1]
    return df.assign(result=[dict(r) for r in df["result"]]) if len(df) else df.copy()


def _read_runs(plot: Plot, spec: ReportSpec, study: str | None) -> pd.DataFrame:
    """load_runs' table, read from the plot's results folders."""
    rows, seen = [], set()
    for index, root in enumerate(plot.roots):
        for f in _result_files(plot, root, study):
            if f.resolve() in seen:  # nested folders given twice, or a run referenced twice: each run once
                continue
            seen.add(f.resolve())
            r = _result_or_none(plot, f)
            if r is None or r.get("experiment") != spec.name:
                continue
            if index > 0:
                r[YOURS] = True
            if _lacks(r, spec.required):
                plot.skip(f, f"result {f} has no {_lacks(r, spec.required)!r}")
                continue
            wrong = mistyped(r, spec_fields(spec))
            if wrong is not None:
                plot.skip(f, f"result {f}: {wrong}")
                continue
            seeds = seeds_of(r)
            if seeds is None:
                plot.skip(f, f"result {f}: its seeds (seeds.base/run, config.seed/run_seed) are not integers")
                continue
            if spec.cl is not None:
                r = with_cl(r, f.parent, spec.cl)
            rows.append({"dir": f.parent, "preset": r["preset"], "method": r["method"],
                         "date": r.get("provenance", {}).get("date", ""), "result": r, "base_seed": seeds[0],
                         "run_seed": seeds[1], "group": config_id(r, spec) if study is None else str(f.parent),
                         "pair": config_id(r, spec, pair=True), "base_build": _base_build(r), "replaces": (),
                         "root": index, "same": config_id(without(r, (YOURS,)), spec)})
    if not rows:
        return pd.DataFrame(columns=[*RUN_COLUMNS, "setting", "order"])
    df = pd.DataFrame(rows).sort_values("date", kind="stable")
    if study is None:
        df = _drawn_once(plot, df)
    df = df.drop(columns=["root", "same"])
    df["setting"] = group_settings(df, spec) if study is None else [marked("", r) for r in df["result"]]
    df["order"] = df["method"].map({m: i for i, m in enumerate(METHOD_ORDER)}).fillna(len(METHOD_ORDER))
    keys = ["preset", "order"] + (["setting", "group", "base_seed", "run_seed"] if study is None else [])
    return df.sort_values(keys, kind="stable").reset_index(drop=True)


def _drawn_once(plot: Plot, df: pd.DataFrame) -> pd.DataFrame:
    """One run per setting and seeds (`same`, base seed, run seed): the first results folder's, within a folder
    the newest (`df` is in date order). Each run left out is one skipped line naming the run drawn instead, and
    is listed in that run's `replaces`."""
    df = df.iloc[::-1].sort_values("root", kind="stable")  # per key: the first folder, newest first
    keys = ["same", "base_seed", "run_seed"]
    kept = ~df.duplicated(keys, keep="first")
    drawn = {tuple(row[k] for k in keys): row for _, row in df[kept].iterrows()}
    gone: dict[Path, list[Path]] = {}
    for _, row in df[~kept].iterrows():
        winner = drawn[tuple(row[k] for k in keys)]
        gone.setdefault(winner["dir"], []).append(row["dir"])
        rule = "the first results folder's" if winner["root"] != row["root"] else "the newer"
        plot.skip(row["dir"] / "result.json", f"{row['dir']}: the same setting and seeds (base {row['base_seed']}, "
                  f"run {row['run_seed']}) as {winner['dir']}, which is drawn instead ({rule}; a setting and seeds "
                  f"are drawn once)")
    df = df[kept].sort_values("date", kind="stable")
    return df.assign(replaces=[tuple(gone.get(d, ())) for d in df["dir"]])


def _base_build(r: dict) -> str:
    """Which build of its base a run started from (scalecl.training.record.base_identity, as a short hash; ''
    when the run does not record it): two builds of one base seed are not the same base to pair runs on."""
    ident = base_identity(r)
    return "" if ident is None else hashlib.sha256(repr(ident).encode()).hexdigest()[:10]


def one_build(g: pd.DataFrame) -> pd.DataFrame:
    """A group's runs on one build of each base seed (a build is the same code and seeds on another machine, whose
    float rounding makes another base; a mean never mixes two): per base seed the build with the most runs there,
    ties to the build of its earliest run."""
    if g.empty or g.groupby("base_seed")["base_build"].nunique().max() <= 1:
        return g
    keep = []
    for _, on in g.groupby("base_seed", sort=False):
        counts = on.groupby("base_build")["date"].agg(["size", "min"])
        best = min(counts.index, key=lambda b: (-counts.at[b, "size"], counts.at[b, "min"]))
        keep += list(on.index[on["base_build"] == best])
    return g.loc[[i for i in g.index if i in set(keep)]]


def find_files(root: Path, name: str) -> list[Path]:
    """Every file called `name` under root, sorted. Unlike Path.rglob, a folder that vanishes during the walk
    (a run writing its temporaries while `plot` reads) is passed over, not an error."""
    root = Path(root)
    if root.is_file():
        return [root] if root.name == name else []
    return sorted(Path(d) / name for d, _, files in os.walk(root) if name in files)


def _result_files(plot: Plot, root: Path, study: str | None) -> list[Path]:
    """The result.json files of a study's runs (study=None: of the main runs) under root. A study's value whose
    run lives among the main runs has a `reference.json` in its folder (scalecl.experiments.study) instead of a copy: its
    target's result.json is returned (a folder holding its own result.json keeps that one)."""
    found = [f for f in find_files(root, "result.json") if _study_of(f) == study]
    if study is None:
        return found
    for ref in find_files(root, "reference.json"):
        if _study_of(ref) != study or (ref.parent / "result.json").exists():
            continue
        target = _reference_target(plot, ref)
        if target is not None:
            found.append(target)
    return found


def _reference_target(plot: Plot, ref: Path) -> Path | None:
    """The result.json a study's reference.json points at, or None with the reason recorded as skipped."""
    try:
        doc = read_json(ref, "unreadable reference")
        rel = doc.get("reference") if isinstance(doc, dict) else None
        if not isinstance(rel, str) or not rel:
            raise ScaleclError(f"unreadable reference {ref}: no 'reference' path")
    except ScaleclError as e:
        plot.skip(ref, str(e))
        return None
    if not plot.unverified and not proves(ref.parent, REFERENCE_WRITER, ref.name):
        plot.skip(ref, f"{ref}: not a reference a study wrote, or changed since (its folder's manifest does not prove "
                       f"it); plot --unverified follows it anyway")
        return None
    target = Path(os.path.normpath(ref.parent / rel / "result.json"))
    if not target.is_file():
        plot.skip(ref, f"{ref} refers to {ref.parent / rel}, which holds no result.json (moved or removed?)")
        return None
    return target


def seeds_of(r: dict) -> tuple[int, int] | None:
    """(base seed, run seed) of a result: its `seeds`, else config.seed / config.run_seed; older results
    without them: run seed 0 (and base seed 0 without config.seed). None when one is not an integer."""
    cfg = r.get("config") if isinstance(r.get("config"), dict) else {}
    s = r.get("seeds") if isinstance(r.get("seeds"), dict) else {}
    seeds = (s.get("base", cfg.get("seed", 0)), s.get("run", cfg.get("run_seed", 0)))
    return seeds if all(isinstance(v, int) and not isinstance(v, bool) for v in seeds) else None


def config_rest(r: dict, spec: ReportSpec, pair: bool = False) -> dict:
    """The config a replicate group shares: without its seeds and without the keys a run's name leaves out
    (spec.not_named: checkpointing and the compute options, which cannot change its numbers beyond float
    rounding, and the per-method tables, whose entry for the run config_id adds as its options and rate), nor
    a key added later that holds its default (spec.named_when_set). pair=True: also without any per-method
    table."""
    cfg = r.get("config") if isinstance(r.get("config"), dict) else {}
    rest = named_dict(without(cfg, SEED_KEYS), spec.not_named, spec.named_when_set)
    if isinstance(rest.get("base"), str):  # a GGUF base by its content, wherever its cache was
        rest["base"] = base_name(rest["base"])
    return {k: v for k, v in rest.items() if not (pair and k in METHOD_KEYS and isinstance(v, dict))}


ROUTE_ONLY = ("tau", "router")  # SCALE options only SCALE-Route reads (Preserve and Adapt record them too)


def used_options(r: dict) -> dict:
    """A run's method options that its method reads: SCALE-Route's router options are left out of every other
    method's (a Preserve or Adapt run made under another default tau is the same run)."""
    opts = r.get("method_options") or {}
    return opts if r.get("method") == "scale-route" else {k: v for k, v in opts.items() if k not in ROUTE_ONLY}


def config_id(r: dict, spec: ReportSpec, pair: bool = False) -> str:
    """A short hash of a run's replicate group (pair=False: its run name without seeds and numerics) or of the
    base it shares with other methods (pair=True)."""
    ident = [r["experiment"], r["preset"], config_rest(r, spec, pair)]
    if not pair:
        ident += [r["method"], used_options(r), r.get("lr")]
        ident += marks(r)  # unverified, or from a later results folder: never a replicate of the first's proven runs
    text = json.dumps(ident, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def dotted_json(d: dict, prefix: str = "") -> dict[str, str]:
    """A nested dict as dotted keys -> JSON values."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out |= dotted_json(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = json.dumps(v, sort_keys=True, default=str)
    return out


def varying_keys(flats: list[dict[str, str]]) -> list[str]:
    """The keys whose values (or presence) differ among the dicts."""
    keys = sorted(set().union(*flats)) if flats else []
    return [k for k in keys if len({f.get(k) for f in flats}) > 1]


def _steps(v: Any) -> str:
    return "only at the start and end" if v == 0 else f"every {v:,} steps" if isinstance(v, int) else f"every {v} steps"


def _final_docs(v: Any) -> str:
    return {-1: "no whole-set evaluation", 0: "whole held-out sets"}.get(v, f"first {v:,} held-out docs")


def _final_length(v: Any) -> str:
    return "whole sets at the model's length" if v == 0 else f"whole sets also at {v:,} tokens"


# config keys as a legend says them (noun when a run does not record it, the value in words): settings differ
# there between runs made before a key existed and after, or by a user's --set
READABLE_KEYS: dict[str, tuple[str, Any]] = {
    "eval.every": ("evaluation interval", lambda v: f"evaluated {_steps(v)}"),
    "eval.final_take": ("whole-set evaluation", _final_docs),
    "eval.final_context": ("whole-set length", _final_length),
    "eval.take": ("evaluation docs", lambda v: f"{v:,} evaluation docs"),
    "checkpoint.every": ("checkpoint interval", lambda v: "no step checkpoints" if v == 0 else f"checkpoints {_steps(v)}"),
}


def setting_parts(flat: dict[str, str], keys: list[str], options: bool = False) -> list[str]:
    """The parts of a legend that tell a setting apart, in words: `flat` a run's config (or, `options`, its method
    options) as `dotted_json` gives it, `keys` those that vary. Method options keep their paper names ('tau=0.5';
    an option a run does not set is its method's default), known config keys are said in words ('evaluated every
    15 steps', 'whole held-out sets'), others by their words without dots ('train seq len 128'); config keys a
    run does not record (made before they existed) are one part ('whole-set evaluation, whole-set length not
    recorded'). Never a raw dotted key."""
    parts, unrecorded = [], []
    for k in keys:
        name = k.removeprefix("options.")
        text = flat.get(k)
        value = json.loads(text) if text is not None else None
        if options or name != k:
            parts.append(f"{name}=default" if text is None else f"{name}={'auto' if value is None else _plain(value)}")
        elif text is None:
            unrecorded.append(READABLE_KEYS.get(k, (_words(k), None))[0])
        else:
            parts.append(_said(k, value))
    return parts + ([f"{', '.join(unrecorded)} not recorded"] if unrecorded else [])


def _said(key: str, value: Any) -> str:
    """A config key and its value in words: READABLE_KEYS's, '10 stage-3 steps', else 'train seq len 128'."""
    if key in READABLE_KEYS:
        try:
            return READABLE_KEYS[key][1](value)
        except (TypeError, ValueError):
            return f"{READABLE_KEYS[key][0]} {_plain(value)}"
    if (m := re.fullmatch(r"stage(\d)\.steps", key)) and isinstance(value, int):
        return f"{value:,} stage-{m[1]} steps"
    return f"{_words(key)} {_plain(value)}"


def _words(key: str) -> str:
    """A dotted config key in words: 'train.seq_len' -> 'train seq len', 'stage3.lr' -> 'stage-3 lr'."""
    return re.sub(r"^stage(\d)\.", r"stage-\1 ", key).replace(".", " ").replace("_", " ")


def _plain(value: Any) -> str:
    """A config value as a legend says it: lists joined with '+', a path without the machine's folders
    (shown_path), others as written (no quotes)."""
    if isinstance(value, list):
        return "+".join(map(_plain, value))
    return str(value).replace('"', "") if not isinstance(value, str) else shown_path(value)


def shown_path(source: str) -> str:
    """A model or data source as an output names it, never by a folder of the machine that made the run: a base in
    a scalecl cache by its entry (base_name), an absolute path by its file or folder name ('.../corpus.txt'),
    anything else (a hub name, 'builtin', a relative path) as given."""
    name = base_name(source)
    if name != str(source) or not (os.path.isabs(name) or re.match(r"^[A-Za-z]:[\\/]", name)):
        return name
    parts = Path(name).parts
    if parts[-1] == "final" and len(parts) > 2:  # a checkpoint: its run's folder names it
        return f".../{parts[-2]}/final"
    return f".../{parts[-1]}" if len(parts) > 1 else name


def group_settings(df: pd.DataFrame, spec: ReportSpec, most: int = 4) -> pd.Series:
    """Per run, what tells its replicate group from the others of its preset: the config keys that differ
    across the preset's groups and the method options that differ across the method's groups ('' if none)."""
    labels: dict[str, str] = {}
    firsts = df.drop_duplicates("group")
    for _, g in firsts.groupby("preset", sort=False):
        shared = {row["group"]: dotted_json(config_rest(row["result"], spec, pair=True)) for _, row in g.iterrows()}
        opts = {row["group"]: dotted_json(used_options(row["result"])) for _, row in g.iterrows()}
        keys = varying_keys(list(shared.values()))
        for _, row in g.iterrows():
            same = [opts[x] for x in g[g["method"] == row["method"]]["group"]]
            parts = setting_parts(shared[row["group"]], keys)
            parts += setting_parts(opts[row["group"]], varying_keys(same), options=True)
            label = ", ".join(parts[:most]) + (f", +{len(parts) - most} more" if len(parts) > most else "")
            labels[row["group"]] = marked(label, row["result"])
        for _, same in g.groupby("method", sort=False):  # equal labels of different groups: their rates tell,
            rates = dict(zip(same["group"], (lr_text(r) for r in same["result"]), strict=True))  # else hashes
            before = {x: labels[x] for x in same["group"]}
            for x in same["group"]:
                twins = [y for y in same["group"] if before[y] == before[x]]
                if len(twins) > 1 and len({rates[y] for y in twins}) == len(twins):
                    labels[x] = ", ".join(filter(None, (labels[x], f"lr={rates[x]}")))
                elif len(twins) > 1:  # told apart past the label's length: numbered in the preset's order
                    n = f"variant {twins.index(x) + 1}"
                    labels[x] = f"{labels[x]}, {n}" if labels[x] else n
    return df["group"].map(labels)


def lr_text(r: dict) -> str:
    """A run's own learning rate (result.json `lr`) as a label, '' when it has none."""
    lr = r.get("lr")
    return f"{lr:g}" if isinstance(lr, int | float) and not isinstance(lr, bool) else ""


def replicate_groups(runs: pd.DataFrame) -> list[pd.DataFrame]:
    """The runs split into their replicate groups, in the runs' order (a study's runs: one each)."""
    return [g for _, g in runs.groupby("group", sort=False)] if len(runs) else []


def group_label(row: pd.Series | dict) -> str:
    """A replicate group's name in figures and tables: the method's label, and its setting when it has one."""
    name, setting = LABELS.get(row["method"], row["method"]), row.get("setting") or ""
    if setting.startswith(f"{name} "):  # a setting that is a whole name ("FFT + base avg. in training")
        return setting
    setting = setting.removeprefix(f"{name}, ") if setting != name else ""  # a reference run's setting names it
    return f"{name} [{setting}]" if setting else name


def rated_setting(row: pd.Series | dict) -> str:
    """A replicate group's setting that names its learning rate (result.json `lr`): its setting, with
    'lr=<rate>' added unless it has one (figures that draw a method at several rates)."""
    setting, lr = row.get("setting") or "", lr_text(row["result"])
    if not lr or any(part.startswith("lr=") for part in setting.split(", ")):
        return setting
    return ", ".join(filter(None, (setting, f"lr={lr}")))


def seeds_text(g: pd.DataFrame) -> str:
    return ", ".join(f"{b}/{r}" for b, r in zip(g["base_seed"], g["run_seed"], strict=True))


def inputs_text(runs: pd.DataFrame, what: str) -> str:
    """The inputs of a figure or table: per replicate group, its runs' folders and seeds (base/run)."""
    lines = [f"{what}", f"{len(runs)} run(s) in {len(replicate_groups(runs))} group(s); seeds as base/run.", ""]
    for g in replicate_groups(runs):
        first = g.iloc[0]
        group = f" group {first['group']}" if first["group"] != str(first["dir"]) else ""
        lines.append(f"{first['preset']} {group_label(first)}{group}: n = {len(g)} (seeds {seeds_text(g)})")
        lines += [f"  {d}" + (f" (drawn instead of {', '.join(map(str, gone))}: the same setting and seeds)"
                              if gone else "") for d, gone in zip(g["dir"], g["replaces"], strict=True)]
    return "\n".join(lines) + "\n"


def value_at(r: dict, path: str):
    """A dotted path of a result (None where it is missing)."""
    v = r
    for k in path.split("."):
        v = v.get(k) if isinstance(v, dict) else None
    return v


def load_metrics(plot: Plot, run_dir: Path) -> pd.DataFrame | None:
    """A run's metrics.jsonl as a frame sorted by step; None (the run recorded as skipped) when it is missing,
    empty or malformed."""
    return _read_jsonl(plot, Path(run_dir) / "metrics.jsonl", required=True)


def metrics_with(plot: Plot, run_dir: Path, *columns: str) -> pd.DataFrame | None:
    """load_metrics, and None (recorded as skipped) when it lacks one of `columns`."""
    m = load_metrics(plot, run_dir)
    lacking = [c for c in columns if m is not None and c not in m]
    if lacking:
        plot.skip(Path(run_dir) / "metrics.jsonl", f"{Path(run_dir) / 'metrics.jsonl'} has no {lacking[0]!r}")
        return None
    return m


def _read_jsonl(plot: Plot, path: Path, required: bool = False) -> pd.DataFrame | None:
    """A JSON-lines log as a frame sorted by step; None when the run has none (older runs) or it is empty.
    A malformed log (and, if `required`, a missing one) is recorded as skipped. Read once per plot (several
    figures draw one run's log); each call gets its own copy."""
    key = ("jsonl", Path(path), required)
    if key not in plot.loaded:
        plot.loaded[key] = _parse_jsonl(plot, Path(path), required)
    df = plot.loaded[key]
    return None if df is None else df.copy()


def _parse_jsonl(plot: Plot, path: Path, required: bool) -> pd.DataFrame | None:
    """_read_jsonl's frame, read from the file."""
    if not path.exists() or (path.is_file() and path.stat().st_size == 0):
        if required:
            plot.skip(path, f"{path} is missing or empty")
        return None
    try:
        rows = read_jsonl(path, "unreadable log")
        _check_log_values(rows, path)
        df = pd.DataFrame(rows)
        if not df.empty and "step" in df:
            return df.drop_duplicates("step", keep="last").sort_values("step").reset_index(drop=True)
        why = f"{path} has no 'step' column"
    except (ScaleclError, TypeError, ValueError) as e:  # unreadable, or steps that do not sort
        why = str(e)
    plot.skip(path, why)
    return None


def _check_log_values(rows: list[dict], path: Path) -> None:
    """Every value the suite logs is a finite number or null (a step an integer): anything else (NaN, text,
    a list) was not written by a run and would break a figure. One ScaleclError naming the file and line."""
    for i, row in enumerate(rows, 1):
        for k, v in row.items():
            number = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            if not (number or v is None) or (k == "step" and not isinstance(v, int)):
                raise ScaleclError(f"{path} (record {i}): {k!r} is {v!r}, not a finite number")


def load_train_log(plot: Plot, run_dir: Path) -> pd.DataFrame | None:
    """The per-step training log (step, loss, lr, grad_norm, tokens, seconds, tokens_per_s), or None."""
    return _read_jsonl(plot, Path(run_dir) / "train_log.jsonl")


def metrics_or_none(plot: Plot, run_dir: Path) -> pd.DataFrame | None:
    """A run's metrics.jsonl, or None when it has none (a malformed one recorded as skipped)."""
    return _read_jsonl(plot, Path(run_dir) / "metrics.jsonl")


def study_names(plot: Plot, spec: ReportSpec) -> list[str]:
    """The studies (folders under a `studies/`) that hold finished runs of an experiment, sorted."""
    names = set()
    for root in plot.roots:
        for f in [*find_files(root, "result.json"), *find_files(root, "reference.json")]:
            s = _study_of(f)
            if s is None:
                continue
            target = f if f.name == "result.json" else _reference_target(plot, f)
            if target is not None and (_result_or_none(plot, target) or {}).get("experiment") == spec.name:
                names.add(s)
    return sorted(names)

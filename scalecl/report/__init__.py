"""Results folder -> pandas -> the paper's figures and tables. Pure functions of the results files:
nothing here trains or needs a GPU, so every figure can be rebuilt at any time with `scalecl plot`."""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from scalecl.common.errors import ScaleclError  # noqa: E402
from scalecl.common.files import OwnedFiles  # noqa: E402
from scalecl.common.readers import read_json, read_jsonl  # noqa: E402
from scalecl.methods.base import METHOD_ORDER  # noqa: E402
from scalecl.report.stats import LEVEL, binomial_se, interval_note, t_interval, t_quantile  # noqa: E402

# Every figure has a `draw_*` function that builds it from the results files and yields (file stem, Figure)
# pairs, open and unsaved, so its content can be inspected; the `fig*` function beside it saves each one.
Drawn = Iterator[tuple[str, Figure]]

LABELS = {"fft": "FFT", "lora": "LoRA", "freeze": "Freeze", "llama-pro": "LLaMA Pro", "scale-preserve": "SCALE-Preserve",
          "scale-adapt": "SCALE-Adapt", "scale-route": "SCALE-Route"}
# Paper Sec. 5.2 / Fig. 8, quoted for comparison (the paper gives these in prose, not as a table)
PAPER_FIG8 = ("paper (Pythia-160M, 100k people): FFT and LLaMA Pro Task 0 fall to ~15% within 200 steps; "
              "SCALE-Route stays at 100% for 4,000 steps and ends at 36.9%")


def _roots(results: Path | Sequence[Path]) -> list[Path]:
    return [Path(results)] if isinstance(results, str | Path) else [Path(r) for r in results]


def _study_of(f: Path) -> str | None:
    """The study a result belongs to: the folder after the last 'studies' in its path (.../studies/<study>/<run>)."""
    parts = f.resolve().parts[:-2]
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] == "studies" and i + 1 < len(parts):
            return parts[i + 1]
    return None


# Runs a figure or table left out because a file of theirs is missing or malformed: file -> why. Every reader
# below records here instead of failing; plot_all starts it afresh and `scalecl plot` prints one line per entry.
SKIPPED: dict[str, str] = {}
# what the tables and captions read from a result.json, per experiment (a run lacking one is skipped)
RESULT_KEYS = {
    "bio": ("summary.task0_start", "summary.task0_min", "summary.task0_end", "summary.task1_end",
            "final.task0_heldout.acc", "final.task1.acc", "priors.task0_heldout.pooled", "config.stage3.steps",
            "config.stage3.batch", "config.stage3.lr", "config.model.hidden", "config.model.layers",
            "config.eval.slice_people", "data.n_bio", "data.n_task1", "trainable_params", "lr"),
    "cpt": ("summary.old_ppl_start", "summary.old_ppl_end", "summary.old_ppl_max", "summary.new_ppl_start",
            "summary.new_ppl_end", "summary.rep_cos_end", "final", "config.train", "trainable_params", "lr"),
}


def _skip(path: Path, why: str) -> None:
    SKIPPED.setdefault(str(path), why)


def read_result(f: Path) -> dict:
    """A result.json (an object naming its experiment, preset and method), or one clear error naming the file."""
    try:
        r = read_json(f, "unreadable result")
    except ScaleclError as e:
        raise ScaleclError(f"{e}; remove its run folder or rerun it") from None
    for key in ("experiment", "preset", "method"):
        if not isinstance(r.get(key), str):
            raise ScaleclError(f"unreadable result {f}: not a scalecl result (no {key!r}); remove its run folder "
                               f"or rerun it")
    return r


def _lacks(r: dict) -> str | None:
    """The first key (dotted path) of RESULT_KEYS that the result lacks, or None."""
    for path in RESULT_KEYS.get(r["experiment"], ()):
        v = r
        for k in path.split("."):
            v = v.get(k) if isinstance(v, dict) else None
        if v is None:
            return path
    return None


def _result_or_none(f: Path) -> dict | None:
    """read_result, or None with the file recorded in SKIPPED."""
    try:
        return read_result(f)
    except ScaleclError as e:
        _skip(f, str(e))
        return None


RUN_COLUMNS = ["dir", "preset", "method", "date", "result", "base_seed", "run_seed", "group", "pair"]
SEED_KEYS = ("seed", "run_seed")  # what replicates of one setting differ in
METHOD_KEYS = ("methods", "lr_scale", "lr")  # per-method tables of a config: runs of other methods differ there


def load_runs(results: Path | Sequence[Path], experiment: str, study: str | None = None) -> pd.DataFrame:
    """One row per finished run (result.json) of an experiment, with its replicate group and seeds.

    Main runs: replicates are kept. A replicate group is (experiment, preset, method, method options, config
    without its seeds) (`group`, a short hash, and `setting`, what tells it from the preset's other groups);
    in a group one run per (base seed, run seed), the newest. `pair` names the runs that share a base: same
    experiment, preset and config outside the seeds and the per-method tables.
    Study sweeps live under `.../studies/<study>/`: they are left out of the main figures and, with `study=`,
    loaded alone (one row per run, each its own group, since their options differ). Several results folders
    may be given.
    """
    rows, seen = [], set()
    for root in _roots(results):
        for f in _result_files(root, study):
            if f.resolve() in seen:  # nested folders given twice, or a run referenced twice: each run once
                continue
            seen.add(f.resolve())
            r = _result_or_none(f)
            if r is None or r.get("experiment") != experiment:
                continue
            if _lacks(r):
                _skip(f, f"result {f} has no {_lacks(r)!r}")
                continue
            seeds = seeds_of(r)
            if seeds is None:
                _skip(f, f"result {f}: its seeds (seeds.base/run, config.seed/run_seed) are not integers")
                continue
            rows.append({"dir": f.parent, "preset": r["preset"], "method": r["method"],
                         "date": r.get("provenance", {}).get("date", ""), "result": r, "base_seed": seeds[0],
                         "run_seed": seeds[1], "group": _config_id(r) if study is None else str(f.parent),
                         "pair": _config_id(r, pair=True)})
    if not rows:
        return pd.DataFrame(columns=[*RUN_COLUMNS, "setting", "order"])
    df = pd.DataFrame(rows).sort_values("date", kind="stable")
    if study is None:
        df = df.drop_duplicates(["group", "base_seed", "run_seed"], keep="last")
    df["setting"] = _settings(df) if study is None else ""
    df["order"] = df["method"].map({m: i for i, m in enumerate(METHOD_ORDER)}).fillna(len(METHOD_ORDER))
    keys = ["preset", "order"] + (["setting", "group", "base_seed", "run_seed"] if study is None else [])
    return df.sort_values(keys, kind="stable").reset_index(drop=True)


def find_files(root: Path, name: str) -> list[Path]:
    """Every file called `name` under root, sorted. Unlike Path.rglob, a folder that vanishes during the walk
    (a run writing its temporaries while `plot` reads) is passed over, not an error."""
    root = Path(root)
    if root.is_file():
        return [root] if root.name == name else []
    return sorted(Path(d) / name for d, _, files in os.walk(root) if name in files)


def _result_files(root: Path, study: str | None) -> list[Path]:
    """The result.json files of a study's runs (study=None: of the main runs) under root. A study's value whose
    run lives among the main runs has a `reference.json` in its folder (scalecl.experiments.study) instead of a copy: its
    target's result.json is returned (a folder holding its own result.json keeps that one)."""
    found = [f for f in find_files(root, "result.json") if _study_of(f) == study]
    if study is None:
        return found
    for ref in find_files(root, "reference.json"):
        if _study_of(ref) != study or (ref.parent / "result.json").exists():
            continue
        target = _reference_target(ref)
        if target is not None:
            found.append(target)
    return found


def _reference_target(ref: Path) -> Path | None:
    """The result.json a study's reference.json points at, or None with the reason recorded in SKIPPED."""
    try:
        doc = read_json(ref, "unreadable reference")
        rel = doc.get("reference") if isinstance(doc, dict) else None
        if not isinstance(rel, str) or not rel:
            raise ScaleclError(f"unreadable reference {ref}: no 'reference' path")
    except ScaleclError as e:
        _skip(ref, str(e))
        return None
    target = Path(os.path.normpath(ref.parent / rel / "result.json"))
    if not target.is_file():
        _skip(ref, f"{ref} refers to {ref.parent / rel}, which holds no result.json (moved or removed?)")
        return None
    return target


def seeds_of(r: dict) -> tuple[int, int] | None:
    """(base seed, run seed) of a result: its `seeds`, else config.seed / config.run_seed; older results
    without them: run seed 0 (and base seed 0 without config.seed). None when one is not an integer."""
    cfg = r.get("config") if isinstance(r.get("config"), dict) else {}
    s = r.get("seeds") if isinstance(r.get("seeds"), dict) else {}
    seeds = (s.get("base", cfg.get("seed", 0)), s.get("run", cfg.get("run_seed", 0)))
    return seeds if all(isinstance(v, int) and not isinstance(v, bool) for v in seeds) else None


def _config_rest(r: dict, pair: bool = False) -> dict:
    """The config without its seeds (pair=True: also without the per-method tables) and without the CPU thread
    count (compute.threads): the thread count changes floating-point sums, not the experiment, and runs made
    before the option existed record none, so a setting's replicates group across it (result.json's
    `run.numerics` still tells them apart)."""
    cfg = r.get("config") if isinstance(r.get("config"), dict) else {}
    rest = {k: v for k, v in cfg.items()
            if k not in SEED_KEYS and not (pair and k in METHOD_KEYS and isinstance(v, dict))}
    if isinstance(rest.get("compute"), dict):
        rest["compute"] = {k: v for k, v in rest["compute"].items() if k != "threads"}
    return rest


def _config_id(r: dict, pair: bool = False) -> str:
    """A short hash of a run's replicate group (pair=False) or of the base it shares with other methods."""
    ident = [r["experiment"], r["preset"], _config_rest(r, pair)]
    if not pair:
        ident += [r["method"], r.get("method_options") or {}]
    text = json.dumps(ident, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _flat(d: dict, prefix: str = "") -> dict[str, str]:
    """A nested dict as dotted keys -> JSON values."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out |= _flat(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = json.dumps(v, sort_keys=True, default=str)
    return out


def _varying(flats: list[dict[str, str]]) -> list[str]:
    """The keys whose values (or presence) differ among the dicts."""
    keys = sorted(set().union(*flats)) if flats else []
    return [k for k in keys if len({f.get(k) for f in flats}) > 1]


def _settings(df: pd.DataFrame, most: int = 4) -> pd.Series:
    """Per run, what tells its replicate group from the others of its preset: the config keys that differ
    across the preset's groups and the method options that differ across the method's groups ('' if none)."""
    labels: dict[str, str] = {}
    firsts = df.drop_duplicates("group")
    for _, g in firsts.groupby("preset", sort=False):
        shared = {row["group"]: _flat(_config_rest(row["result"], pair=True)) for _, row in g.iterrows()}
        opts = {row["group"]: _flat(row["result"].get("method_options") or {}) for _, row in g.iterrows()}
        keys = _varying(list(shared.values()))
        for _, row in g.iterrows():
            same = [opts[x] for x in g[g["method"] == row["method"]]["group"]]
            parts = [f"{k}={shared[row['group']].get(k, 'unset')}" for k in keys]
            parts += [f"{k}={opts[row['group']].get(k, 'unset')}" for k in _varying(same)]
            label = ", ".join(parts[:most]) + (f", +{len(parts) - most} more" if len(parts) > most else "")
            labels[row["group"]] = label.replace('"', "")
        for _, same in g.groupby("method", sort=False):  # equal labels of different groups: their rates tell,
            rates = dict(zip(same["group"], (_lr_text(r) for r in same["result"]), strict=True))  # else hashes
            before = {x: labels[x] for x in same["group"]}
            for x in same["group"]:
                twins = [y for y in same["group"] if before[y] == before[x]]
                if len(twins) > 1 and len({rates[y] for y in twins}) == len(twins):
                    labels[x] = ", ".join(filter(None, (labels[x], f"lr={rates[x]}")))
                elif len(twins) > 1:
                    labels[x] = f"{labels[x]}, #{x}" if labels[x] else f"#{x}"
    return df["group"].map(labels)


def _lr_text(r: dict) -> str:
    """A run's own learning rate (result.json `lr`) as a label, '' when it has none."""
    lr = r.get("lr")
    return f"{lr:g}" if isinstance(lr, int | float) and not isinstance(lr, bool) else ""


def replicate_groups(runs: pd.DataFrame) -> list[pd.DataFrame]:
    """The runs split into their replicate groups, in the runs' order (a study's runs: one each)."""
    return [g for _, g in runs.groupby("group", sort=False)] if len(runs) else []


def group_label(row: pd.Series | dict) -> str:
    """A replicate group's name in figures and tables: the method's label, and its setting when it has one."""
    name = LABELS.get(row["method"], row["method"])
    return f"{name} [{row['setting']}]" if row.get("setting") else name


def _seeds_text(g: pd.DataFrame) -> str:
    return ", ".join(f"{b}/{r}" for b, r in zip(g["base_seed"], g["run_seed"], strict=True))


def inputs_text(runs: pd.DataFrame, what: str) -> str:
    """The inputs of a figure or table: per replicate group, its runs' folders and seeds (base/run)."""
    lines = [f"{what}", f"{len(runs)} run(s) in {len(replicate_groups(runs))} group(s); seeds as base/run.", ""]
    for g in replicate_groups(runs):
        first = g.iloc[0]
        group = f" group {first['group']}" if first["group"] != str(first["dir"]) else ""
        lines.append(f"{first['preset']} {group_label(first)}{group}: n = {len(g)} (seeds {_seeds_text(g)})")
        lines += [f"  {d}" for d in g["dir"]]
    return "\n".join(lines) + "\n"


def _replicates_note(runs: pd.DataFrame) -> str:
    """Caption line: how many replicates each group has."""
    counts = ", ".join(f"{group_label(g.iloc[0])} {len(g)}" for g in replicate_groups(runs))
    return f"Replicates (runs with other seeds) per line: {counts}."


def load_metrics(run_dir: Path) -> pd.DataFrame | None:
    """A run's metrics.jsonl as a frame sorted by step; None (the run recorded in SKIPPED) when it is missing,
    empty or malformed."""
    return _read_jsonl(Path(run_dir) / "metrics.jsonl", required=True)


def _metrics_with(run_dir: Path, *columns: str) -> pd.DataFrame | None:
    """load_metrics, and None (recorded in SKIPPED) when it lacks one of `columns`."""
    m = load_metrics(run_dir)
    lacking = [c for c in columns if m is not None and c not in m]
    if lacking:
        _skip(Path(run_dir) / "metrics.jsonl", f"{Path(run_dir) / 'metrics.jsonl'} has no {lacking[0]!r}")
        return None
    return m


STALE: list[str] = []  # the last plot_all's removed outputs: its own files of an earlier call not drawn again
_BATCH: list[OwnedFiles] = []  # plot_all's one deferred writer: every output is checked before any is written


def _owned(out: Path) -> OwnedFiles:
    """The figures folder: plot replaces only files it wrote there itself (scalecl.common.files.OwnedFiles). Inside
    plot_all, its deferred writer: nothing is written until every figure and table has been checked."""
    if _BATCH and _BATCH[0].folder == Path(out):
        return _BATCH[0]
    return OwnedFiles(out, "scalecl plot")


def _save(fig, out: Path, stem: str) -> list[Path]:
    """Save a figure as PNG and PDF, and its inputs (the runs it draws) as `<stem>.inputs.txt` when it has them."""
    owned = _owned(out)
    paths = []
    inputs = getattr(fig, INPUTS_ATTR, None)
    try:
        for name in [f"{stem}.png", f"{stem}.pdf"] + ([f"{stem}.inputs.txt"] if inputs else []):
            owned.check(name)  # before drawing: a user's file of that name is refused
        for ext in ("png", "pdf"):
            buf = io.BytesIO()
            fig.savefig(buf, format=ext, dpi=150, bbox_inches="tight")
            paths.append(owned.write(f"{stem}.{ext}", buf.getvalue()))  # never through a link
        if inputs:
            paths.append(owned.write(f"{stem}.inputs.txt", inputs))
    finally:
        plt.close(fig)
    return paths


INPUTS_ATTR = "scalecl_inputs"  # a drawn figure's inputs (inputs_text), saved beside it by _save
BAND_ALPHA = 0.2
BAND_NOTE = ("Lines: mean over a group's replicates; shaded: the 95% Student-t interval per step over the runs "
             "evaluated at that step (mean +- t_0.975,n-1 s/sqrt(n)); a group of one run: its line alone.")


def _with_inputs(fig: Figure, runs: pd.DataFrame, what: str) -> Figure:
    """Attach the figure's inputs (run folders and replicates per group) for _save to write beside it."""
    setattr(fig, INPUTS_ATTR, inputs_text(runs, what))
    return fig


def mean_curve(frames: Sequence[pd.DataFrame], column: str) -> pd.DataFrame | None:
    """A column over steps across replicate runs: per step, over the runs evaluated at that step, n, mean,
    sd and the 95% Student-t interval (lo, hi; NaN where n < 2). None when no run has the column."""
    parts = [f[["step", column]].dropna() for f in frames if f is not None and column in f]
    parts = [x for x in parts if len(x)]
    if not parts:
        return None
    long = pd.concat(parts, ignore_index=True)
    values = long[column].astype(float).groupby(long["step"])
    out = pd.DataFrame({"n": values.count(), "mean": values.mean(), "sd": values.std(ddof=1)})
    out = out.rename_axis("step").reset_index()
    tq = out["n"].map(lambda n: t_quantile(0.5 + LEVEL / 2, int(n) - 1) if n >= 2 else math.nan)
    half = tq * out["sd"] / out["n"].astype(float) ** 0.5
    out["lo"], out["hi"] = out["mean"] - half, out["mean"] + half
    return out


def _draw_mean(ax, curve: pd.DataFrame, scale: float = 1.0, **style):
    """The mean line of a mean_curve, and its interval shaded where >= 2 runs were evaluated."""
    (ln,) = ax.plot(curve["step"], scale * curve["mean"], **style)
    if (curve["n"] >= 2).any():
        ax.fill_between(curve["step"], scale * curve["lo"], scale * curve["hi"], color=ln.get_color(),
                        alpha=BAND_ALPHA, lw=0)
    return ln


def _group_metrics(g: pd.DataFrame, *columns: str) -> list[pd.DataFrame]:
    """The metrics of a replicate group's runs that have them (the others named in SKIPPED)."""
    return [m for m in (_metrics_with(d, *columns) for d in g["dir"]) if m is not None]


def _n_label(label: str, n: int) -> str:
    return f"{label} (n={n})" if n >= 2 else label


def _save_all(figures: Iterable[tuple[str, Figure]], out: Path) -> list[Path]:
    """Save (and close) each drawn figure as it is built: one figure open at a time."""
    return [p for stem, fig in figures for p in _save(fig, out, stem)]


def _bio_caption(r: dict) -> str:
    d, m, s3 = r["data"], r["config"]["model"], r["config"]["stage3"]
    return (f"preset '{r['preset']}': {d['n_bio']:,} people pre-trained, {d['n_bio'] // 2:,} QA-trained (Task 0), "
            f"{d['n_task1']:,} new (Task 1); GPT-NeoX d={m['hidden']}, {m['layers']} layers; Task 1: "
            f"{s3['steps']} steps x batch {s3['batch']}, FFT lr {s3['lr']:g}. Accuracy on "
            f"{r['config']['eval']['slice_people']}-person slices.")


def fig8(results: Path, out: Path) -> list[Path]:
    """Task 0 / Task 1 first-token accuracy vs Task 1 steps, one panel per method (paper Fig. 8)."""
    return _save_all(draw_fig8(results), out)


def draw_fig8(results: Path) -> Drawn:
    """Paper Fig. 8 per preset: a panel per replicate group (method), titled by its label, in method order;
    the mean over replicates with its t-interval band."""
    runs = load_runs(results, "bio")
    for preset, group in runs.groupby("preset", sort=False):
        reps = replicate_groups(group)
        n = len(reps)
        ncols = min(4, n)
        nrows = math.ceil(n / ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 2.9 * nrows + 0.8), squeeze=False,
                                 sharey=True)
        for ax, g in zip(axes.flat, reps, strict=False):
            ms = _group_metrics(g, "task0/acc", "task1/acc")
            if ms:  # else each run is named in SKIPPED
                _fig8_panel(ax, g, ms)
        for ax in axes[:, 0]:
            ax.set_ylabel("first-token acc. (%)")
        for ax in list(axes.flat)[n:]:
            ax.axis("off")
        handles, labels = axes.flat[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="upper center", ncol=3, frameon=False, bbox_to_anchor=(0.5, 1.0))
        first = group.iloc[0]["result"]
        band = "\n" + BAND_NOTE if any(len(g) >= 2 for g in reps) else ""
        fig.text(0.5, -0.02, _bio_caption(first) + "\n" + PAPER_FIG8 + band + "\n" + _replicates_note(group),
                 ha="center", va="top", fontsize=8, wrap=True)
        fig.tight_layout(rect=(0, 0, 1, 0.95))
        yield f"fig8_bio_{preset}", _with_inputs(fig, group, f"fig8_bio_{preset}: Task 0 / Task 1 accuracy per step")


def _fig8_panel(ax, g: pd.DataFrame, ms: list[pd.DataFrame]) -> None:
    """One Fig. 8 panel: Task 0 and Task 1 accuracy (mean and band over the group's runs), the chance floor."""
    prior = t_interval(r["priors"]["task0_heldout"]["pooled"] for r in g["result"]).mean
    for key, color, label in (("task0/acc", "tab:blue", "Task 0 (held-out)"), ("task1/acc", "tab:orange", "Task 1")):
        _draw_mean(ax, mean_curve(ms, key), 100, marker=".", ms=3, color=color, label=label)
    ax.axhline(100 * prior, color="grey", ls=":", lw=1, label="Task 0 chance floor")
    ax.set_title(_n_label(group_label(g.iloc[0]), len(ms)), fontsize=10)
    ax.set_ylim(-2, 102)
    ax.grid(alpha=0.3)
    ax.set_xlabel("Task 1 step")


def bio_table(results: Path) -> pd.DataFrame:
    """Per replicate group: Task 0 at start / minimum / end, Task 1 at end (slices, with their binomial SE),
    full-range final accuracy; each the mean over replicates with its 95% t interval (`_ci_lo`, `_ci_hi`)."""
    return aggregate_table(load_runs(results, "bio"), BIO_METRICS, lambda r: {
        "trainable": r["trainable_params"], "lr": r["lr"]})


def _get(r: dict, path: str):
    """A dotted path of a result (None where it is missing)."""
    v = r
    for k in path.split("."):
        v = v.get(k) if isinstance(v, dict) else None
    return v


def _slice_questions(r: dict) -> int | None:
    """Questions in one evaluation slice: slice_people x the attributes asked per person (the keys of
    priors.task0_heldout besides 'pooled'); None when the result does not say."""
    attrs = [k for k in (_get(r, "priors.task0_heldout") or {}) if k != "pooled"]
    people = _get(r, "config.eval.slice_people")
    return people * len(attrs) if attrs and isinstance(people, int) else None


# (column, where in result.json, questions behind one value: for a binomial SE, or None)
BIO_METRICS = (("task0_start", "summary.task0_start", _slice_questions),
               ("task0_min", "summary.task0_min", _slice_questions),
               ("task0_end", "summary.task0_end", _slice_questions),
               ("task1_end", "summary.task1_end", _slice_questions),
               ("task0_full_end", "final.task0_heldout.acc", None), ("task1_full_end", "final.task1.acc", None),
               ("task0_prior", "priors.task0_heldout.pooled", None))
CPT_METRICS = tuple((c, f"summary.{c}", None) for c in ("old_ppl_start", "old_ppl_end", "old_ppl_max",
                                                       "new_ppl_start", "new_ppl_end", "rep_cos_end"))


def aggregate_table(runs: pd.DataFrame, metrics: tuple, head) -> pd.DataFrame:
    """One row per replicate group: preset, method, setting, group, n, seeds (base/run), `head(result)`, then
    per metric its mean over replicates, the 95% t interval (`_ci_lo`, `_ci_hi`; NaN for n = 1) and, where the
    questions behind it are known, `_binom_se` (sqrt(p(1-p)/q) at the mean)."""
    rows = []
    for g in replicate_groups(runs):
        first = g.iloc[0]
        rec = {"preset": first["preset"], "method": first["method"], "setting": first["setting"],
               "group": first["group"], "n": len(g), "interval": interval_note(len(g)),
               "seeds": _seeds_text(g), **head(first["result"])}
        for col, path, questions in metrics:
            iv = t_interval(_get(r, path) for r in g["result"])
            rec |= {col: iv.mean, f"{col}_ci_lo": iv.lo, f"{col}_ci_hi": iv.hi}
            if questions is not None:
                rec[f"{col}_binom_se"] = binomial_se(iv.mean, questions(first["result"]))
        rows.append(rec)
    return pd.DataFrame(rows)


def _cell(row: pd.Series, col: str, fmt: str) -> str:
    """A table cell: mean +- half-width of the t interval (n >= 2) or the value, and the binomial SE if known."""
    mean = row[col]
    if pd.isna(mean):
        return ""
    text = fmt.format(mean)
    if not pd.isna(row.get(f"{col}_ci_hi", math.nan)):
        text += " ± " + fmt.format(row[f"{col}_ci_hi"] - mean)
    se = row.get(f"{col}_binom_se", math.nan)
    return text + (f" (SE {fmt.format(se)})" if not pd.isna(se) else "")


def shown_aggregate(df: pd.DataFrame, metrics: tuple, fmt: str = "{:.3f}") -> pd.DataFrame:
    """The Markdown/LaTeX view of an aggregate_table: a cell 'mean ± half-width (SE se)' per metric."""
    cols = ["preset", "method"] + (["setting"] if df["setting"].astype(bool).any() else [])
    shown = df[cols + ["interval", "seeds", *[c for c in df.columns if c in ("trainable", "lr")]]].copy()
    for col, _, _ in metrics:
        shown[col] = [_cell(row, col, fmt) for _, row in df.iterrows()]
    return shown


AGG_CAPTION = ("Mean over replicates (runs of one setting with other base/run seeds) ± the half-width of the 95% "
               "Student-t interval, mean ± t_0.975,n-1 · s/√n ('interval': t interval, n = k per row; "
               "n=1 (no interval): the value alone). CSV: `<col>` mean, `<col>_ci_lo`/`_ci_hi` the interval.")


def write_table(df: pd.DataFrame, out: Path, stem: str, float_fmt: str = "{:.3f}", shown: pd.DataFrame | None = None,
                caption: str | None = None, inputs: str | None = None) -> list[Path]:
    """CSV (full precision), Markdown and LaTeX (rounded, or `shown` as given) versions of one table; the
    caption under the Markdown table (`Table: ...`) and atop the LaTeX one (comments); the inputs (run folders)
    as `<stem>.inputs.txt`."""
    out.mkdir(parents=True, exist_ok=True)
    if shown is None:
        shown = df.copy()
        for c in shown.columns:
            if shown[c].dtype.kind == "f" and c != "lr":
                shown[c] = shown[c].map(lambda v: "" if pd.isna(v) else float_fmt.format(v))  # not recorded: blank
            elif shown[c].isna().any():
                shown[c] = shown[c].astype(object).where(shown[c].notna(), "")
    owned = _owned(out)
    names = [f"{stem}.{ext}" for ext in ("csv", "md", "tex")] + ([f"{stem}.inputs.txt"] if inputs else [])
    for name in names:  # all checked before the first is written
        owned.check(name)
    md = shown.to_markdown(index=False) + "\n" + (f"\nTable: {caption}\n" if caption else "")
    tex = shown.map(lambda v: v.replace("±", "$\\pm$") if isinstance(v, str) else v).to_latex(index=False)
    tex = "".join(f"% {line}\n" for line in (caption or "").splitlines()) + tex
    paths = [owned.write(f"{stem}.csv", df.to_csv(index=False)), owned.write(f"{stem}.md", md),
             owned.write(f"{stem}.tex", tex)]
    return paths + ([owned.write(f"{stem}.inputs.txt", inputs)] if inputs else [])


# ---------------------------------------------------------------------------------------------------------
# Continual pre-training (paper Figs. 4, 5, 6, 7, 9)

COLORS = {m: c for m, c in zip(METHOD_ORDER, ("tab:red", "tab:purple", "tab:brown", "tab:orange", "tab:green",
                                               "tab:cyan", "tab:blue"), strict=True)}


# FFT in fig9 is drawn on top of the others, thick and dashed: methods that learn like it would hide it
FFT_STYLE = {"lw": 2.6, "ls": (0, (5, 2)), "zorder": 5, "marker": "o", "ms": 3.5}
FFT_NOTE = ("FFT: thick dashed line drawn over the others (methods close to it would hide it). Perplexity axes "
            "are log scale.")


def _cpt_caption(r: dict) -> str:
    c = r["config"]
    base = c.get("base", r.get("base", {}).get("source", "?"))
    train = c.get("data", {}).get("path", r.get("data", {}).get("train", "?"))
    if str(base) == "builtin":
        base = "a small Llama pre-trained on the stand-in's English (builtin)"
    return (f"preset '{r['preset']}': base {base}; new-domain data {train}; {c['train']['steps']} steps x "
            f"{c['train']['batch']} x {c['train']['seq_len']} tokens. Old = forgetting PPL, new = learning PPL.")


def fig9(results: Path, out: Path) -> list[Path]:
    """Forgetting (old-domain) and learning (new-domain) perplexity vs steps, all methods (paper Fig. 9)."""
    return _save_all(draw_fig9(results), out)


def draw_fig9(results: Path) -> Drawn:
    """Paper Fig. 9 per preset: old- and new-domain perplexity, a line per replicate group (mean and band)."""
    for preset, group in load_runs(results, "cpt").groupby("preset", sort=False):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        reps = replicate_groups(group)
        for g in reps:
            ms = _group_metrics(g, "old/ppl", "new/ppl")
            if not ms:  # named in SKIPPED
                continue
            style = FFT_STYLE if g.iloc[0]["method"] == "fft" else {"marker": ".", "ms": 3}
            for ax, key in zip(axes, ("old/ppl", "new/ppl"), strict=True):
                _draw_mean(ax, mean_curve(ms, key), color=COLORS.get(g.iloc[0]["method"]),
                           label=_n_label(group_label(g.iloc[0]), len(ms)), **style)
        axes[0].set_title("(a) forgetting: old-domain perplexity")
        axes[1].set_title("(b) learning: new-domain perplexity")
        for ax in axes:
            ax.set_xlabel("training step")
            ax.set_ylabel("perplexity (log scale)")
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.yaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
            ax.grid(alpha=0.3, which="both")
        axes[1].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
        band = "\n" + BAND_NOTE if any(len(g) >= 2 for g in reps) else ""
        fft = "\n" + FFT_NOTE if (group["method"] == "fft").any() else ""
        fig.text(0.5, -0.02, _cpt_caption(group.iloc[0]["result"]) + fft + band + "\n" + _replicates_note(group),
                 ha="center", va="top", fontsize=8, wrap=True)
        fig.tight_layout()
        yield f"fig9_cpt_{preset}", _with_inputs(fig, group, f"fig9_cpt_{preset}: old/new-domain perplexity")


def fig4(results: Path, out: Path) -> list[Path]:
    """Representation cosine (original channels, step 0 vs now) and forgetting PPL: width vs depth (Fig. 4)."""
    return _save_all(draw_fig4(results), out)


def draw_fig4(results: Path) -> Drawn:
    """Paper Fig. 4 per preset with a width or depth run: representation cosine and old-domain perplexity."""
    wanted = ("scale-preserve", "scale-adapt", "llama-pro")
    names = {"scale-preserve": "Width (Preserve)", "scale-adapt": "Width (Adapt)", "llama-pro": "Depth (LLaMA Pro)"}
    for preset, group in load_runs(results, "cpt").groupby("preset", sort=False):
        group = group[group["method"].isin(wanted)]
        if group.empty:
            continue
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for g in replicate_groups(group):
            ms = _group_metrics(g, "rep_cos", "old/ppl")
            if not ms:  # named in SKIPPED
                continue
            row = g.iloc[0]
            label = names[row["method"]]
            if row["method"] == "scale-adapt":
                label += ", " + l_fp_text(row["result"]["method_options"].get("l_fp"), row["result"])
            label = _n_label(label + (f" [{row['setting']}]" if row["setting"] else ""), len(ms))
            for ax, key in zip(axes, ("rep_cos", "old/ppl"), strict=True):
                _draw_mean(ax, mean_curve(ms, key), marker=".", ms=3, color=COLORS[row["method"]], label=label)
        axes[0].set_title("(a) representation forgetting")
        axes[0].set_ylabel("cosine of final hidden states (step 0 vs now)")
        axes[1].set_title("(b) forgetting perplexity (old domain)")
        axes[1].set_ylabel("perplexity")
        for ax in axes:
            ax.set_xlabel("training step")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        band = "\n" + BAND_NOTE if any(len(g) >= 2 for g in replicate_groups(group)) else ""
        fig.text(0.5, -0.02, _cpt_caption(group.iloc[0]["result"]) + band + "\n" + _replicates_note(group),
                 ha="center", va="top", fontsize=8, wrap=True)
        fig.tight_layout()
        yield f"fig4_width_vs_depth_{preset}", _with_inputs(fig, group, f"fig4_width_vs_depth_{preset}")


def _study_label(study: str, opts: dict) -> str:
    if study == "init":
        return ",".join(i.upper() if i != "zero" else "0" for i in opts.get("init", ()))
    if study == "l_fp":
        return l_fp_text(opts.get("l_fp"))
    return "+".join(opts.get("collab", ()))


def _embedding_variant(r: dict) -> str:
    """How a run's new embedding columns started and whether its base ties embedding and head: the init study's
    pairs with W21 = 0 learn only when the new columns are non-zero, which needs an untied base."""
    base = r.get("config", {}).get("base", "builtin")
    tied = r.get("config", {}).get("model", {}).get("tie_embeddings") if base == "builtin" else None
    ties = {True: "tied base", False: "untied base", None: str(base)}[tied]
    return f"{ties}, new embedding columns {r.get('method_options', {}).get('embed_init', 'zero')}"


def study_table(results: Path, study: str) -> pd.DataFrame:
    """One row per study run: its swept option and the end points of forgetting / learning perplexity."""
    rows = []
    for _, row in load_runs(results, "cpt", study=study).iterrows():
        r = row["result"]
        opts = r.get("method_options", {})
        s = r["summary"]
        rows.append({"study": study, "preset": row["preset"], "method": row["method"],
                     "variant": _embedding_variant(r),
                     "setting": _study_label(study, opts), "l_fp": opts.get("l_fp"),
                     "old_ppl_start": s["old_ppl_start"], "old_ppl_end": s["old_ppl_end"],
                     "new_ppl_start": s["new_ppl_start"], "new_ppl_end": s["new_ppl_end"],
                     "up_norm_end": r["final"].get("up_norm"), "dir": str(row["dir"])})
    df = pd.DataFrame(rows)
    if study == "l_fp" and len(df):
        df = df.sort_values("l_fp")
    return df.reset_index(drop=True)


STUDY_TABLES = {"init": "table_fig5_init", "l_fp": "table_fig6_l_fp", "collab": "table_fig7_collab"}


def _study_setting(study: str, r: dict) -> str:
    """What tells a study's settings apart (the swept value, plus the embedding variant of a CPT study); runs
    with equal settings differ only in their seeds and are replicates."""
    if r.get("experiment") == "bio":
        return _setting(study, r)
    return f"{_study_label(study, r.get('method_options') or {})}; {_embedding_variant(r)}"


def study_means(runs: pd.DataFrame, experiment: str, study: str) -> pd.DataFrame:
    """One row per setting of a study (`runs`: its load_runs; replicates pooled): n, seeds, then the end points'
    mean and 95% t interval over the replicates (aggregate_table's columns)."""
    if runs.empty:
        return pd.DataFrame()
    settings = [_study_setting(study, r) for r in runs["result"]]
    keys = [_study_sort_key(study, r) for r in runs["result"]]
    runs = runs.assign(setting=settings, group=[f"{m} {x}" for m, x in zip(runs["method"], settings, strict=True)])
    runs = runs.iloc[sorted(range(len(runs)), key=lambda i: keys[i])]
    metrics = BIO_METRICS if experiment == "bio" else CPT_METRICS
    return aggregate_table(runs, metrics, lambda r: {"lr": r["lr"]})


def write_study_means(results: Path | Sequence[Path], out: Path, experiment: str, study: str, stem: str
                      ) -> list[Path]:
    """<stem>_means (md/csv/tex): the study's settings with their replicates pooled; nothing when no setting has
    more than one run (the per-run table says it all)."""
    runs = load_runs(results, experiment, study=study)
    df = study_means(runs, experiment, study)
    if df.empty or not (df["n"] > 1).any():
        return []
    metrics = BIO_METRICS if experiment == "bio" else CPT_METRICS
    return write_table(df, out, f"{stem}_means", shown=shown_aggregate(df, metrics), caption=AGG_CAPTION,
                       inputs=inputs_text(runs, f"{stem}_means: one row per setting, its replicates pooled"))


def pool_replicates(rows: list[tuple[pd.Series, pd.DataFrame]], setting_of) -> list[tuple[pd.Series, pd.DataFrame]]:
    """A study's (table row, metrics) pairs with the replicates of one setting (`setting_of(row)`) drawn as one
    line: the first row, its setting marked with n, and per step the mean of every metric over the runs
    evaluated there, with `<metric>:lo` / `<metric>:hi` its 95% t interval (NaN where fewer than 2 runs)."""
    groups: dict[str, list[tuple[pd.Series, pd.DataFrame]]] = {}
    for row, m in rows:
        groups.setdefault(setting_of(row), []).append((row, m))
    out = []
    for members in groups.values():
        row, m = members[0]
        if len(members) > 1:
            row = row.copy()
            row["setting"] = f"{row['setting']} (mean of {len(members)})"
            m = _pooled_metrics([x for _, x in members])
        out.append((row, m))
    return out


def _pooled_metrics(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Per step, each numeric metric's mean over the frames (mean_curve) and its interval as `:lo` / `:hi`."""
    out = _mean_frame(frames)
    for c in [c for c in out.columns if c != "step"]:
        curve = mean_curve(frames, c)
        if curve is not None:
            out = out.merge(curve[["step", "lo", "hi"]].rename(columns={"lo": f"{c}:lo", "hi": f"{c}:hi"}),
                            on="step", how="left")
    return out


def _band(ax, m: pd.DataFrame, x: str, col: str, color, scale: float = 1.0) -> None:
    """The interval a pooled metrics frame carries for `col` (pool_replicates), shaded; nothing for one run."""
    if f"{col}:lo" in m and m[f"{col}:lo"].notna().any():
        ax.fill_between(m[x], scale * m[f"{col}:lo"], scale * m[f"{col}:hi"], color=color, alpha=BAND_ALPHA, lw=0)


def _study_caption(fig: Figure, results: Path, study: str, df: pd.DataFrame, note: str = "") -> Figure:
    """Caption a study's figure (method + run settings) and lay it out."""
    runs = load_runs(results, "cpt", study=study)
    r0 = runs.iloc[0]["result"]
    fig.text(0.5, -0.02, f"{df['method'].iloc[0]}{note}; " + _cpt_caption(r0), ha="center", va="top", fontsize=8,
             wrap=True)
    fig.tight_layout()
    return _with_inputs(fig, runs, f"study '{study}': one line or point per run")


def _save_study(figures: Drawn, results: Path, out: Path, study: str) -> list[Path]:
    """Save a study's figure and write the study's table beside it (nothing when there is no figure)."""
    paths = _save_all(figures, out)
    if not paths:
        return []
    inputs = inputs_text(load_runs(results, "cpt", study=study), f"{STUDY_TABLES[study]}: one row per run")
    return paths + write_table(study_table(results, study).drop(columns="dir"), out, STUDY_TABLES[study],
                               inputs=inputs) + write_study_means(results, out, "cpt", study, STUDY_TABLES[study])


def fig5(results: Path, out: Path) -> list[Path]:
    """Forgetting and learning PPL per (W21, W22) initialisation pair (paper Fig. 5); one row of panels per
    embedding variant (tied or untied base, new embedding columns zero or random) when the study has several."""
    return _save_study(draw_fig5(results), results, out, "init")


def draw_fig5(results: Path) -> Drawn:
    """Paper Fig. 5: a row of (forgetting, learning) panels per embedding variant, a line per init pair."""
    df = study_table(results, "init")
    if df.empty:
        return
    variants = list(dict.fromkeys(df["variant"]))
    settings = sorted(dict.fromkeys(df["setting"]))  # one colour per pair in every row of panels
    color_of = {setting: f"C{i % 10}" for i, setting in enumerate(settings)}  # categorical: matplotlib's cycle
    fig, axes = plt.subplots(len(variants), 2, figsize=(11, 4 * len(variants)), squeeze=False)
    for (ax_old, ax_new), variant in zip(axes, variants, strict=True):
        rows = [(row, _metrics_with(row["dir"], "old/ppl", "new/ppl")) for _, row in
                df[df["variant"] == variant].iterrows()]
        rows = sorted([(r, m) for r, m in rows if m is not None], key=lambda rm: settings.index(rm[0]["setting"]))
        pooled = pool_replicates(rows, lambda r: r["setting"])  # in the order of `settings`
        for (row, m), setting in zip(pooled, dict.fromkeys(r["setting"] for r, _ in rows), strict=True):
            for ax, col in ((ax_old, "old/ppl"), (ax_new, "new/ppl")):
                color = color_of[setting]
                ax.plot(m["step"], m[col], marker=".", ms=3, label=row["setting"], color=color)
                _band(ax, m, "step", col, color)
        suffix = f"\n{variant}" if len(variants) > 1 else ""
        ax_old.set_title("(a) forgetting PPL (old domain)" + suffix)
        ax_new.set_title("(b) learning PPL (new domain)" + suffix)
        for ax in (ax_old, ax_new):
            ax.set_xlabel("training step")
            ax.set_ylabel("perplexity")
            ax.grid(alpha=0.3)
            ax.legend(title="W21,W22", fontsize=8)
    yield "fig5_init_pairs", _study_caption(fig, results, "init", df)


def fig6(results: Path, out: Path) -> list[Path]:
    """Forgetting vs learning perplexity as the number of function-preserving layers l_fp varies (Fig. 6)."""
    return _save_study(draw_fig6(results), results, out, "l_fp")


def draw_fig6(results: Path) -> Drawn:
    """Paper Fig. 6: end-of-run forgetting and learning perplexity against l_fp, one point per run."""
    df = study_table(results, "l_fp")
    if df.empty:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, col, color, title in ((axes[0], "old_ppl_end", "tab:red", "(a) forgetting PPL at the end"),
                                  (axes[1], "new_ppl_end", "tab:blue", "(b) learning PPL at the end")):
        ivs = {k: t_interval(g[col]) for k, g in df.groupby("l_fp", sort=True)}  # replicates pooled per l_fp
        x, mean = list(ivs), [iv.mean for iv in ivs.values()]
        most = max(iv.n for iv in ivs.values())
        ax.plot(x, mean, marker="o", color=color)
        if most > 1:  # replicates: their 95% t interval (none drawn for a single run)
            ax.errorbar(x, mean, yerr=[[iv.mean - iv.lo if iv.n > 1 else 0 for iv in ivs.values()],
                                       [iv.hi - iv.mean if iv.n > 1 else 0 for iv in ivs.values()]],
                        fmt="none", ecolor=color, capsize=3)
        ax.set_title(title + (f"\n(mean of up to {most} runs, 95% t interval)" if most > 1 else ""))
    for ax in axes:
        ax.set_xlabel("l_fp (function-preserving lower layers)")
        ax.set_xticks(df["l_fp"].tolist())
        ax.set_ylabel("perplexity")
        ax.grid(alpha=0.3)
    yield "fig6_l_fp", _study_caption(fig, results, "l_fp", df)


def fig7(results: Path, out: Path) -> list[Path]:
    """Forgetting PPL against the average upscaled-weight norm, collaborative module attn vs mlp (Fig. 7)."""
    return _save_study(draw_fig7(results), results, out, "collab")


def draw_fig7(results: Path) -> Drawn:
    """Paper Fig. 7: old-domain perplexity against the upscaled weights' norm, a line per collab setting."""
    df = study_table(results, "collab")
    if df.empty:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    rows = [(row, _metrics_with(row["dir"], "old/ppl")) for _, row in df.iterrows()]
    for row, m in pool_replicates([(r, m) for r, m in rows if m is not None], lambda r: r["setting"]):
        if "up_norm" in m:
            ax.plot(m["up_norm"], m["old/ppl"], marker=".", ms=4, label=f"W12 trains in {row['setting']}")
    ax.set_xlabel("average norm of upscaled weights (W12, W21, W22)")
    ax.set_ylabel("forgetting PPL (old domain)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    yield "fig7_collab_modules", _study_caption(fig, results, "collab", df, ", " + l_fp_text(df["l_fp"].iloc[0]))


def cpt_table(results: Path) -> pd.DataFrame:
    """Per replicate group: perplexity end points and representation cosine, means with 95% t intervals."""
    return aggregate_table(load_runs(results, "cpt"), CPT_METRICS, lambda r: {
        "trainable": r["trainable_params"], "lr": r["lr"]})


# ---------------------------------------------------------------------------------------------------------
# Table 2: lm-evaluation-harness scores


def table2(results: Path) -> pd.DataFrame:
    """Harness scores per evaluated checkpoint, with the language averages and the paper's averages beside."""
    from scalecl.evaluation.harness import PAPER_ROWS

    rows = []
    for f in sorted(f for root in _roots(results) for f in find_files(root, "run.json")):
        try:
            run = read_json(f, "harness result")
        except ScaleclError as e:
            _skip(f, str(e))
            continue
        if "scores" not in run:
            continue
        if not (isinstance(run["scores"], list) and isinstance(run.get("model"), str) and all(
                isinstance(sc, dict) and isinstance(sc.get("task"), str) and "score" in sc for sc in run["scores"])):
            _skip(f, f"harness result {f} is malformed (its model or scores)")
            continue
        method = run.get("method")
        row = {"method": method or "base", "model": Path(run["model"]).name}
        for sc in run["scores"]:
            row[sc["task"]] = sc["score"]
        paper = PAPER_ROWS.get(method, (None, {}))[1]
        row["paper_english_avg"] = paper.get("english")
        row["paper_korean_avg"] = paper.get("korean")
        rows.append(row)
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------------------
# Training logs, routing, and the biography Route studies (issues #12, #13). Every figure here reads what the
# run folders hold and skips what they lack: older runs have no train_log.jsonl and no answer-position keys.

SMOOTH_FRACTION = 0.02  # the loss's running mean spans this fraction of a run's steps,
SMOOTH_MIN = 5  # and at least this many, but never more than a quarter of the run (its shape must show)
LOG_RATIO = {"loss": 20, "lr": 3}  # a log y-axis when a figure's largest value exceeds its smallest this much
LINESTYLES = ("-", "--", "-.", ":")
EARLY_FRACTION = 0.2  # table column: answer-position routing averaged over the first 20% of steps
QUANTILE_BANDS = (("q05", "q95", 0.15), ("q25", "q75", 0.3))  # (low, high, alpha): the router-score bands
TASKS = (("task0", "Task 0 (held-out)", "tab:blue"), ("task1", "Task 1", "tab:orange"))
CPT_SETS = (("old", "old domain", "tab:blue"), ("new", "new domain", "tab:orange"))
PATHS = (("preserve", "-"), ("adapt", "--"))
ROUTER_ORDER = ("logit", "centered", "prob")
BIO_STUDIES = {"tau": "fig8_route_tau", "router": "fig8_route_router", "vocab": "fig8_route_vocab"}


def _read_jsonl(path: Path, required: bool = False) -> pd.DataFrame | None:
    """A JSON-lines log as a frame sorted by step; None when the run has none (older runs) or it is empty.
    A malformed log (and, if `required`, a missing one) is recorded in SKIPPED."""
    if not path.exists() or (path.is_file() and path.stat().st_size == 0):
        if required:
            _skip(path, f"{path} is missing or empty")
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
    _skip(path, why)
    return None


def _check_log_values(rows: list[dict], path: Path) -> None:
    """Every value the suite logs is a finite number or null (a step an integer): anything else (NaN, text,
    a list) was not written by a run and would break a figure. One ScaleclError naming the file and line."""
    for i, row in enumerate(rows, 1):
        for k, v in row.items():
            number = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            if not (number or v is None) or (k == "step" and not isinstance(v, int)):
                raise ScaleclError(f"{path} (record {i}): {k!r} is {v!r}, not a finite number")


def _figure_legend(fig, axes) -> None:
    """One legend right of the figure with every label of `axes` once (in order of first appearance)."""
    entries: dict = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(lab, h)
    fig.legend(list(entries.values()), list(entries), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8,
               frameon=False)


def load_train_log(run_dir: Path) -> pd.DataFrame | None:
    """The per-step training log (step, loss, lr, grad_norm, tokens, seconds, tokens_per_s), or None."""
    return _read_jsonl(Path(run_dir) / "train_log.jsonl")


def _metrics_or_none(run_dir: Path) -> pd.DataFrame | None:
    return _read_jsonl(Path(run_dir) / "metrics.jsonl")


def study_names(results: Path | Sequence[Path], experiment: str) -> list[str]:
    """The studies (folders under a `studies/`) that hold finished runs of an experiment, sorted."""
    names = set()
    for root in _roots(results):
        for f in [*find_files(root, "result.json"), *find_files(root, "reference.json")]:
            s = _study_of(f)
            if s is None:
                continue
            target = f if f.name == "result.json" else _reference_target(f)
            if target is not None and (_result_or_none(target) or {}).get("experiment") == experiment:
                names.add(s)
    return sorted(names)


def _vocab_rows(r: dict) -> tuple[int | None, int | None]:
    """(model rows, tokenizer size): result.json's `vocab` if present, else the configured rows (0: none)."""
    v = r.get("vocab") or {}
    configured = r.get("config", {}).get("model", {}).get("vocab")
    return v.get("model") or configured or None, v.get("tokenizer")


def _setting(study: str | None, r: dict) -> str:
    """A run's label within its group: the method for main runs, the swept value for a study's runs."""
    opts = r.get("method_options") or {}
    if study is None:
        return LABELS.get(r["method"], r["method"])
    if study in BIO_STUDIES and r.get("method") != "scale-route":  # a reference run beside the Route runs
        return f"{LABELS.get(r['method'], r['method'])}, " + _setting(study, {**r, "method": "scale-route"})
    if study in ("tau", "router"):
        label = (f"tau={_tau(r):g}" if _tau(r) is not None else "tau=?") if study == "tau" else \
            f"router={opts.get('router', 'logit')}"
        model, tok = _vocab_rows(r)  # a sweep repeated on a padded vocabulary (--set model.vocab=50304)
        return label + ("" if model is None or tok is None or model == tok else f", vocab {model:,}")
    if study == "vocab":
        model, tok = _vocab_rows(r)
        if model is None:
            return "vocab=tokenizer's size"
        return f"vocab={model:,}" + ("" if tok is None or tok == model else f" (tokenizer {tok:,})")
    if r.get("experiment") == "cpt":
        return _study_label(study, opts)
    return f"{study}={opts.get(study)}"


def _study_sort_key(study: str | None, r: dict) -> tuple:
    """Swept values in their natural order (numbers ascending, the router's forms as the study lists them);
    in a Route study, reference runs of other methods after the Route run of the same value."""
    key = _value_sort_key(study, r)
    return key + (r.get("method") != "scale-route",) if study in BIO_STUDIES else key


def _value_sort_key(study: str | None, r: dict) -> tuple:
    opts = r.get("method_options") or {}
    if study == "tau":
        tau = _tau(r)
        return (_vocab_rows(r)[0] or 0, -math.inf if tau is None else tau)
    if study == "router":
        name = opts.get("router", "logit")
        return (_vocab_rows(r)[0] or 0, ROUTER_ORDER.index(name) if name in ROUTER_ORDER else len(ROUTER_ORDER), name)
    if study == "vocab":
        return (_vocab_rows(r)[0] or 0,)
    if study == "l_fp":
        return (opts.get("l_fp") or 0,)
    return ()


def _groups(results: Path | Sequence[Path], experiment: str) -> list[tuple[str, str | None, pd.DataFrame]]:
    """(file tag, study, runs) per figure: main runs by preset (`bio_cpu`), each study alone (`study_tau`)."""
    out = []
    for preset, group in load_runs(results, experiment).groupby("preset", sort=False):
        out.append((f"{experiment}_{preset}", None, group))
    for study in study_names(results, experiment):
        runs = load_runs(results, experiment, study=study)
        if len(runs):
            keys = [_study_sort_key(study, r) for r in runs["result"]]
            runs = runs.iloc[sorted(range(len(runs)), key=lambda i: keys[i])]
            out.append((f"study_{study}", study, runs))
    return out


def _caption(r: dict) -> str:
    return _bio_caption(r) if r["experiment"] == "bio" else _cpt_caption(r)


def _step_label(experiment: str) -> str:
    return "Task 1 step" if experiment == "bio" else "training step"


def _colors(n: int) -> list:
    """Ordered settings get ordered colours; one run gets the default blue."""
    if n <= 1:
        return ["tab:blue"]
    return [plt.cm.viridis(0.85 * i / (n - 1)) for i in range(n)]


def _missing_note(names: list[str], what: str) -> str:
    return f"\nNot drawn (no {what}; older runs): {', '.join(names)}." if names else ""


def _draw_train_log(results: Path | Sequence[Path], experiment: str, column: str, stem: str) -> Drawn:
    """One figure per group of runs: a per-step train_log.jsonl column against the step, a line per replicate
    group (main runs; its mean over replicates, shaded 95% t interval) or per run (a study). A study whose runs
    start from different bases (the init study's embedding variants) gets a panel per base."""
    for tag, study, runs in _groups(results, experiment):
        if column == "lr" and study is not None:
            continue  # a study's runs share one schedule; the main runs' figure shows it
        lines, missing = _train_log_lines(runs, study, column)
        if not lines:
            continue
        panels = list(dict.fromkeys(line[0] for line in lines))
        fig, axes = plt.subplots(len(panels), 1, figsize=(8, 4.2 if len(panels) == 1 else 3.0 * len(panels) + 0.8),
                                 squeeze=False, sharex=True)
        n_max = max(len(log) for *_, logs in lines for log in logs)
        window = max(1, min(n_max // 4, max(SMOOTH_MIN, round(SMOOTH_FRACTION * n_max))))
        names = list(dict.fromkeys(line[2] for line in lines))
        colors = dict(zip(names, _colors(len(names)), strict=True))
        for ax, panel in zip(axes[:, 0], panels, strict=True):
            mine = [line for line in lines if line[0] == panel]
            styles = [colors[lab] if study is not None else COLORS.get(g.iloc[0]["method"]) for _, g, lab, _ in mine]
            _train_log_panel(ax, mine, styles, column, window)
            ax.set_title(panel if len(panels) > 1 else "", fontsize=9)
            ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5),
                      title=study if study is not None else None)
        axes[-1, 0].set_xlabel(_step_label(experiment))
        what = (f"Training loss per step (faint) and its centred running mean over {window} step(s) (bold)"
                if column == "loss" else "Learning rate per step as the schedule set it")
        where = " (stage 3, Task 1)" if experiment == "bio" else ""
        title = f"{what}{where}, from train_log.jsonl" + (f"; study '{study}'" if study else "") + "."
        if len(panels) > 1:
            title += " The study's runs start from different bases or settings: a panel per one (its title)."
        band = "\n" + BAND_NOTE if any(len(logs) >= 2 for *_, logs in lines) else ""
        fig.text(0.5, -0.02, title + band + "\n" + _caption(lines[0][1].iloc[0]["result"])
                 + _missing_note(missing, "train_log.jsonl"), ha="center", va="top", fontsize=8, wrap=True)
        fig.tight_layout()
        yield f"{stem}_{tag}", _with_inputs(fig, runs, f"{stem}_{tag}: {column} per step from train_log.jsonl")


def _train_log_panel(ax, lines: list, colors: list, column: str, window: int) -> None:
    """One panel of a training-log figure: per line its mean over replicates (loss: faint raw, bold smoothed)."""
    for i, ((_, _, label, logs), color) in enumerate(zip(lines, colors, strict=True)):
        if column == "loss":
            raw = mean_curve(logs, column)
            ax.plot(raw["step"], raw["mean"], color=color, alpha=0.2, lw=0.6)
            smooth = [pd.DataFrame({"step": log["step"], column: log[column].astype(float).rolling(
                window, center=True, min_periods=1).mean()}) for log in logs]
            _draw_mean(ax, mean_curve(smooth, column), color=color, lw=1.4, label=label)
        else:  # equal schedules coincide: a style per method keeps each visible
            _draw_mean(ax, mean_curve(logs, column), color=color, lw=1.6, ls=LINESTYLES[i % len(LINESTYLES)],
                       label=label)
    vals = pd.concat([log[column] for *_, logs in lines for log in logs]).astype(float).dropna()
    if len(vals) and vals.min() > 0 and vals.max() / vals.min() > LOG_RATIO[column]:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_ylabel("training loss (per step)" if column == "loss" else "learning rate")
    ax.grid(alpha=0.3, which="both")


def _train_log_lines(runs: pd.DataFrame, study: str | None, column: str) -> tuple[list[list], list[str]]:
    """The lines of a training-log figure, [panel, group, label, logs] each, and the labels of the groups that
    logged nothing. Labels equal within a panel get what tells their runs apart appended."""
    lines, missing = [], []
    for g in replicate_groups(runs):
        logs = [log for log in map(load_train_log, g["dir"])
                if log is not None and column in log and not log[column].isna().all()]
        label = _line_label(study, g.iloc[0], len(logs))
        r = g.iloc[0]["result"]
        panel = _embedding_variant(r) if study is not None and r["experiment"] == "cpt" else ""
        (lines.append([panel, g, label, logs]) if logs else missing.append(label))
    for panel, label in {(line[0], line[2]) for line in lines}:
        same = [line for line in lines if (line[0], line[2]) == (panel, label)]
        if len(same) < 2:
            continue
        flats = [_flat({**_config_rest(line[1].iloc[0]["result"]),
                        "options": line[1].iloc[0]["result"].get("method_options") or {}}) for line in same]
        keys = _varying(flats)
        for line, flat in zip(same, flats, strict=True):
            extra = ", ".join(f"{k}={flat.get(k, 'unset')}" for k in keys[:3]).replace('"', "")
            line[2] = f"{label} [{extra}]" if extra else f"{label} #{Path(str(line[1].iloc[0]['dir'])).name}"
    return lines, missing


def _line_label(study: str | None, row: pd.Series, n: int = 1) -> str:
    """A line's label: its replicate group (main runs, with n when >= 2) or the study's setting of the run."""
    return _n_label(group_label(row), n) if study is None else _setting(study, row["result"])


def fig_train_loss(results: Path | Sequence[Path], out: Path) -> list[Path]:
    """Training loss per step, raw and smoothed, a line per method (per setting in a study): does it learn?"""
    return _save_all(draw_train_loss(results), out)


def draw_train_loss(results: Path | Sequence[Path]) -> Drawn:
    """The training-loss figures: per run a faint raw line and a bold smoothed one that carries its label."""
    for exp in ("bio", "cpt"):
        yield from _draw_train_log(results, exp, "loss", "train_loss")


def fig_lr_schedule(results: Path | Sequence[Path], out: Path) -> list[Path]:
    """The learning-rate schedule each method trained with, as logged: rates differ per method (lr_scale)."""
    return _save_all(draw_lr_schedule(results), out)


def draw_lr_schedule(results: Path | Sequence[Path]) -> Drawn:
    """The learning-rate figures of the main runs (a study's runs share one schedule): a line per run."""
    for exp in ("bio", "cpt"):
        yield from _draw_train_log(results, exp, "lr", "lr_schedule")


def _has(m: pd.DataFrame, key: str) -> bool:
    return key in m and m[key].notna().any()


def _route_key(m: pd.DataFrame, prefix: str, path: str) -> str | None:
    """The column holding the share of a slice's tokens routed to a path (`prefix/route_<path>`; Task 0 also
    reads legacy keys), or None."""
    for key in (f"{prefix}/route_{path}",) + ((f"route_{path}",) if prefix == "task0" else ()):
        if _has(m, key):
            return key
    return None


def _route_series(m: pd.DataFrame, prefix: str, path: str) -> pd.Series | None:
    """Share of a slice's tokens routed to a path, or None."""
    key = _route_key(m, prefix, path)
    return m[key] if key is not None else None


def _answer_preserve(m: pd.DataFrame, task: str) -> pd.Series | None:
    key = f"{task}/answer/route_preserve"
    return m[key] if _has(m, key) else None


def _route_runs(runs: pd.DataFrame) -> list[tuple[pd.Series, pd.DataFrame, list[pd.DataFrame]]]:
    """SCALE-Route replicate groups (a study: runs) with metrics: (first run, the mean of the group's metrics
    per step, each run's metrics). Runs without a metrics file are left out."""
    picked = []
    for g in replicate_groups(runs[runs["method"] == "scale-route"]):
        frames = [m for m in map(_metrics_or_none, g["dir"]) if m is not None]
        if frames:
            picked.append((g.iloc[0], _mean_frame(frames), frames))
    return picked


def _mean_frame(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Replicates' metrics averaged per step (numeric columns; over the runs that have a value there)."""
    if len(frames) == 1:
        return frames[0]
    long = pd.concat(frames, ignore_index=True)
    return long.select_dtypes("number").groupby("step").mean().reset_index()


def _route_band(ax, frames: list[pd.DataFrame], key: str | None, flip: bool, color) -> None:
    """The 95% t band of a routing share over >= 2 replicates (flip: of 1 - share), in percent."""
    c = mean_curve(frames, key) if key is not None and len(frames) >= 2 else None
    if c is not None and (c["n"] >= 2).any():
        lo, hi = (1 - c["hi"], 1 - c["lo"]) if flip else (c["lo"], c["hi"])
        ax.fill_between(c["step"], 100 * lo, 100 * hi, color=color, alpha=BAND_ALPHA / 2, lw=0)


def _tau(r: dict) -> float | None:
    tau = (r.get("method_options") or {}).get("tau")
    return float(tau) if tau is not None else None


def fig_routing(results: Path | Sequence[Path], out: Path) -> list[Path]:
    """Share of tokens each SCALE-Route run sends to the preserve / adapt path over training, per eval set.

    Bio: all real tokens of the Task 0 and Task 1 slices, and at the scored answer position (adapt = 1 -
    preserve there); cpt: old- and new-domain evaluation text. One row per Route run of a group.
    """
    return _save_all(draw_routing(results), out)


def draw_routing(results: Path | Sequence[Path]) -> Drawn:
    """The routing figures: a row of panels per Route run (all tokens; bio also the answer position)."""
    for experiment in ("bio", "cpt"):
        for tag, study, runs in _groups(results, experiment):
            picked = [(row, m, frames) for row, m, frames in _route_runs(runs)
                      if any(_route_series(m, p, "preserve") is not None
                             for p in ("task0", "task1", "old", "new"))]
            if not picked:
                continue
            answers = experiment == "bio" and any(_answer_preserve(m, t) is not None for _, m, _ in picked
                                                  for t, _, _ in TASKS)
            ncols = 2 if answers else 1
            fig, axes = plt.subplots(len(picked), ncols, figsize=(5.6 * ncols + 1.6, 2.7 * len(picked) + 0.6),
                                     squeeze=False, sharey=True)
            for pick, ax_row in zip(picked, axes, strict=True):
                _routing_row(ax_row, pick, _line_label(study, pick[0], len(pick[2])), experiment, answers)
            for ax in axes[-1]:
                ax.set_xlabel(_step_label(experiment))
            handles, labels = max((ax.get_legend_handles_labels() for ax in axes.flat),
                                  key=lambda h: len(h[0]))
            fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8,
                       frameon=False)
            r0 = picked[0][0]["result"]
            if experiment == "bio":
                what = ("SCALE-Route: share of the real tokens of the Task 0 (held-out) and Task 1 "
                        "evaluation slices routed to the preserve (solid) or adapt (dashed) path"
                        + (", and at the scored answer position (the last prompt token, whose output is the "
                           "answer's first token; adapt = 1 - preserve)" if answers else ""))
            else:
                what = "SCALE-Route: share of old- and new-domain evaluation tokens routed to each path"
            tau = _tau(r0)
            if study == "tau":
                what += "; tau per row"
            elif tau is not None:
                what += f"; tau={tau}"
            band = "\n" + BAND_NOTE if any(len(frames) >= 2 for _, _, frames in picked) else ""
            fig.text(0.5, -0.01, what + (f"; study '{study}'." if study else ".") + band + "\n" + _caption(r0),
                     ha="center", va="top", fontsize=8, wrap=True)
            fig.tight_layout()
            yield f"routing_{tag}", _with_inputs(fig, runs[runs["method"] == "scale-route"], f"routing_{tag}")


def _routing_row(ax_row, pick: tuple, name: str, experiment: str, answers: bool) -> None:
    """One routing row: per slice and path the share routed (all tokens; bio also the answer position), the
    mean over a group's replicates with its band."""
    _, m, frames = pick
    sets = TASKS if experiment == "bio" else CPT_SETS
    for (prefix, set_label, color), lw in zip(sets, (2.4, 1.2), strict=True):  # equal: both show
        for path, ls in PATHS:
            key = _route_key(m, prefix, path)
            if key is not None:
                ax_row[0].plot(m["step"], 100 * m[key], ls=ls, lw=lw, color=color, label=f"{set_label}, {path}")
                _route_band(ax_row[0], frames, key, False, color)
        y = _answer_preserve(m, prefix) if answers else None
        if y is not None:
            for path, ls in PATHS:
                ax_row[1].plot(m["step"], 100 * (y if path == "preserve" else 1 - y), ls=ls,
                               lw=lw, color=color, label=f"{set_label}, {path}")
                _route_band(ax_row[1], frames, f"{prefix}/answer/route_preserve", path != "preserve", color)
    ax_row[0].set_title(f"{name}: all tokens" if experiment == "bio" else name, fontsize=9)
    if answers:
        ax_row[1].set_title(f"{name}: answer position", fontsize=9)
        if not ax_row[1].lines:
            ax_row[1].set_xlim(ax_row[0].get_xlim())
            ax_row[1].text(0.5, 0.5, "no answer-position record (older run)", ha="center",
                           va="center", transform=ax_row[1].transAxes, fontsize=8, color="grey")
    ax_row[0].set_ylabel("tokens routed (%)")
    for ax in ax_row:
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)


def _score(m: pd.DataFrame, task: str, stat: str) -> pd.Series | None:
    key = f"{task}/answer/route_score/{stat}"
    return m[key] if _has(m, key) else None


def fig_router_score(results: Path | Sequence[Path], out: Path) -> list[Path]:
    """The router's cosine at the answer position over training, against tau: why answers go where they do.

    Per Route run and task: median line, q25-q75 and q05-q95 bands, the mean dashed, tau dotted.
    """
    return _save_all(draw_router_score(results), out)


def draw_router_score(results: Path | Sequence[Path]) -> Drawn:
    """The router-score figures: a row per Route run with the score recorded, a panel per task."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    for tag, study, runs in _groups(results, "bio"):
        picked, missing = [], []
        for row, m, frames in _route_runs(runs):
            if any(_score(m, t, "q50") is not None for t, _, _ in TASKS):
                picked.append((row, m, len(frames)))
            else:
                missing.append(_line_label(study, row, len(frames)))
        if not picked:
            continue
        fig, axes = plt.subplots(len(picked), 2, figsize=(11.5, 2.7 * len(picked) + 0.6), squeeze=False,
                                 sharey=True)
        for (row, m, n), ax_row in zip(picked, axes, strict=True):
            name = _line_label(study, row, n)
            tau = _tau(row["result"])
            for ax, (task, task_label, color) in zip(ax_row, TASKS, strict=True):
                ax.set_title(f"{name}: {task_label}", fontsize=9)
                ax.grid(alpha=0.3)
                if tau is not None:
                    ax.axhline(tau, color="tab:red", ls=":", lw=1.2)
                med = _score(m, task, "q50")
                if med is None:
                    ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes,
                            fontsize=8, color="grey")
                    continue
                for lo, hi, alpha in QUANTILE_BANDS:
                    low, high = _score(m, task, lo), _score(m, task, hi)
                    if low is not None and high is not None:
                        ax.fill_between(m["step"], low, high, color=color, alpha=alpha, lw=0)
                ax.plot(m["step"], med, color=color, lw=1.6)
                mean = _score(m, task, "mean")
                if mean is not None:
                    ax.plot(m["step"], mean, color="black", lw=0.8, ls=(0, (3, 2)))
            ax_row[0].set_ylabel("router cosine")
        for ax in axes[-1]:
            ax.set_xlabel("Task 1 step")
        legend = [Line2D([], [], color="grey", lw=1.6, label="median"),
                  *(Patch(color="grey", alpha=alpha, lw=0, label=f"{lo}-{hi}") for lo, hi, alpha in
                    reversed(QUANTILE_BANDS)),
                  Line2D([], [], color="black", lw=0.8, ls=(0, (3, 2)), label="mean"),
                  Line2D([], [], color="tab:red", ls=":", lw=1.2, label="tau (preserve above)")]
        fig.legend(handles=legend, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
        r0 = picked[0][0]["result"]
        tau = _tau(r0)
        tau_note = "" if study == "tau" or tau is None else f" (tau={tau})"
        fig.text(0.5, -0.01, "SCALE-Route: the router's score (the cosine it compares, per its 'router' "
                 "option) at the scored answer position (the last prompt token) of the Task 0 (held-out, "
                 "blue) and Task 1 (orange) evaluation slices; an answer goes to the preserve path when its "
                 f"score exceeds tau{tau_note}" + (f"; study '{study}'." if study else ".") + "\n"
                 + _bio_caption(r0) + ("\nA group of n >= 2 replicates: each statistic averaged over its runs per "
                                       "step." if any(n >= 2 for _, _, n in picked) else "")
                 + _missing_note(missing, "answer-position record"), ha="center", va="top", fontsize=8,
                 wrap=True)
        fig.tight_layout()
        yield f"router_score_{tag}", _with_inputs(fig, runs[runs["method"] == "scale-route"], f"router_score_{tag}")


def _early_mean(m: pd.DataFrame, y: pd.Series | None) -> float:
    """Mean of an evaluation series over steps 0 < step <= EARLY_FRACTION x the last evaluated step."""
    if y is None:
        return math.nan
    last = m["step"].max()
    sel = (m["step"] > 0) & (m["step"] <= EARLY_FRACTION * last)
    return float(y[sel].mean()) if sel.any() else math.nan


def _end(y: pd.Series | None) -> float:
    if y is None or y.dropna().empty:
        return math.nan
    return float(y.dropna().iloc[-1])


def route_study_table(results: Path | Sequence[Path], study: str) -> pd.DataFrame:
    """One row per run of a biography Route study: setting, accuracy end points, answer-position routing."""
    runs = load_runs(results, "bio", study=study)
    early = f"first{round(100 * EARLY_FRACTION)}"
    rows = []
    for _, row in runs.iterrows():
        r = row["result"]
        s, opts = r["summary"], r.get("method_options") or {}
        model_rows, tok = _vocab_rows(r)
        m = _metrics_or_none(row["dir"])
        rec = {"study": study, "preset": row["preset"], "method": row["method"],
               "setting": _setting(study, r), "tau": _tau(r), "router": opts.get("router", "logit"),
               "vocab_model": model_rows, "vocab_tokenizer": tok, "steps": r["config"]["stage3"]["steps"],
               "task0_start": s["task0_start"], "task0_min": s["task0_min"], "task0_end": s["task0_end"],
               "task1_end": s["task1_end"], "task0_full_end": r["final"]["task0_heldout"]["acc"],
               "task1_full_end": r["final"]["task1"]["acc"]}
        for task, _, _ in TASKS:
            y = _answer_preserve(m, task) if m is not None else None
            rec[f"{task}_answer_preserve_end"] = _end(y)
            rec[f"{task}_answer_preserve_{early}"] = _early_mean(m, y) if m is not None else math.nan
        rec["_key"] = _study_sort_key(study, r)
        rec["dir"] = str(row["dir"])
        rows.append(rec)
    if not rows:
        return pd.DataFrame()
    df = pd.DataFrame(rows)
    df = df.iloc[sorted(range(len(df)), key=lambda i: df["_key"].iloc[i])].drop(columns="_key")
    for col in ("vocab_model", "vocab_tokenizer"):
        df[col] = df[col].astype("Int64")
    # the swept option's columns: tau always (Route's threshold), the router and rows where recorded or swept
    unused = [c for c in ("vocab_model", "vocab_tokenizer") if df[c].isna().all() and study != "vocab"]
    return df.drop(columns=unused + ([] if study == "router" else ["router"])).reset_index(drop=True)


def _fmt_option(v) -> str:
    """An option value as a caption shows it: lists joined ('attn+mlp'), others as written."""
    return "+".join(map(str, v)) if isinstance(v, list | tuple) else str(v)


def l_fp_text(l_fp, result: dict | None = None) -> str:
    """`l_fp=N` as a caption or legend shows it. None is SCALE's default, resolved when the model is widened
    (ScaleSpec): L for Preserve, L-1 otherwise (only the top layer's W12 trains); said so, with the number
    when the run records its layer count, never `l_fp=None`."""
    if l_fp is not None and not (isinstance(l_fp, float) and math.isnan(l_fp)):
        return f"l_fp={int(l_fp) if isinstance(l_fp, float) else l_fp}"
    result = result or {}
    layers = (result.get("config") or {}).get("model", {}).get("layers")
    if result.get("method") == "scale-preserve":
        rule, n = "L, every layer preserved", layers
    else:
        rule, n = "L-1, only the top layer's W12 trains", layers - 1 if isinstance(layers, int) else None
    return f"l_fp=auto ({rule}{f': {n}' if isinstance(n, int) else ''})"


def _vocab_key(r: dict) -> int | str:
    """The rows of a run's embedding and head: 'tokenizer' when they are the tokenizer's size (also a run that
    records neither, the default), else the model's rows."""
    model, tok = _vocab_rows(r)
    return "tokenizer" if model is None or model == tok else model


def _vocab_text(key: int | str, r: dict | None = None) -> str:
    """A vocabulary key as a label: '1,045 vocab rows (tokenizer's size)' or '50,304 vocab rows'."""
    if key == "tokenizer":
        tok = _vocab_rows(r)[1] if r is not None else None
        return f"{tok:,} vocab rows (tokenizer's size)" if tok else "vocab rows = tokenizer's size"
    return f"{key:,} vocab rows"


def _trained_like(r: dict, r0: dict) -> bool:
    """Whether a run trained like r0 as far as a reference needs: preset, data (seed aside), stage-3 steps, and
    the same vocabulary rows."""
    def data(x: dict) -> dict:
        return {k: v for k, v in (x.get("data") or {}).items() if k != "seed"}

    return (r["preset"] == r0["preset"] and data(r) == data(r0) and _vocab_key(r) == _vocab_key(r0)
            and _get(r, "config.stage3.steps") == _get(r0, "config.stage3.steps"))


def _fft_reference(results: Path | Sequence[Path], r0: dict) -> tuple[dict | None, str]:
    """The FFT replicate group trained like a study's run r0 (_trained_like; the main runs first, else an FFT
    run in a biography study): {'curves': {key: mean_curve}, 'dirs', 'n', 'label'} and a caption note."""
    pools = [("main", load_runs(results, "bio"))]
    pools += [(f"study '{s}'", load_runs(results, "bio", study=s)) for s in study_names(results, "bio")]
    found, other = [], []
    for where, pool in pools:
        for _, row in pool[(pool["method"] == "fft") & (pool["preset"] == r0["preset"])].iterrows() if len(pool) else []:
            (found if _trained_like(row["result"], r0) else other).append({**row, "where": where,
                                                                           "group": _config_id(row["result"])})
    if not found:
        return None, (f" The FFT runs of preset '{r0['preset']}' ({', '.join(Path(x['dir']).name for x in other)}) "
                      f"trained on other data, steps or vocabulary rows; no reference drawn." if other else
                      f" No FFT run of preset '{r0['preset']}' to draw as a reference.")
    runs = pd.DataFrame(found)
    runs = runs[runs["group"] == runs["group"].iloc[0]].sort_values("date", kind="stable")
    runs = runs.drop_duplicates(["base_seed", "run_seed"], keep="last")
    frames = [m for m in (_metrics_with(d, "task0/acc", "task1/acc") for d in runs["dir"]) if m is not None]
    if not frames:
        return None, " The matching FFT runs have no readable metrics; no reference drawn."
    n, where = len(frames), runs["where"].iloc[0]
    names = ", ".join(Path(d).name for d in runs["dir"])
    vocab = _vocab_text(_vocab_key(r0), r0)
    what = f"the mean of {n} {where} runs ({names}; seeds {_seeds_text(runs)})" if n >= 2 else f"{where} run {names}"
    label = ("FFT (main run)" if where == "main" else "FFT reference") + (f", n={n}" if n >= 2 else "")
    return ({"curves": {k: mean_curve(frames, k) for k in ("task0/acc", "task1/acc")}, "n": n, "label": label,
             "dirs": {str(d) for d in runs["dir"]}}, f" FFT reference with {vocab}: {what}.")


def fig_route_study(results: Path | Sequence[Path], out: Path, study: str) -> list[Path]:
    """Paper Fig. 8 for one Route study: Task 0 / Task 1 accuracy and answer routing, a line per setting."""
    df = route_study_table(results, study)
    paths = _save_all(draw_route_study(results, study, df), out)
    if not paths:
        return []
    stem = BIO_STUDIES.get(study, f"fig8_route_{study}")
    inputs = inputs_text(load_runs(results, "bio", study=study), f"table_{stem}: one row per run")
    return paths + write_table(df.drop(columns="dir"), out, f"table_{stem}", inputs=inputs) + \
        write_study_means(results, out, "bio", study, f"table_{stem}")


def draw_route_study(results: Path | Sequence[Path], study: str, table: pd.DataFrame | None = None) -> Drawn:
    """Paper Fig. 8 for one Route study (`table`: its route_study_table, when already built). Route runs on
    different vocabulary rows (outside the vocab study) get a row of panels each, with the FFT reference
    trained on the same rows; the vocab study keeps one row and draws a reference per vocabulary."""
    df = route_study_table(results, study) if table is None else table
    if df.empty:
        return
    runs = [(row, _metrics_or_none(Path(row["dir"]))) for _, row in df.iterrows()]
    runs = pool_replicates([(row, m) for row, m in runs if m is not None],
                           lambda row: f"{row['method']} {row['setting']}")
    if not runs:
        return
    # panel (c): routing at the answer position; runs older than those records show routing over all tokens
    answers = any(_answer_preserve(m, t) is not None for _, m in runs for t, _, _ in TASKS)
    route = _answer_preserve if answers else (lambda m, task: _route_series(m, task, "preserve"))
    routed = any(route(m, t) is not None for _, m in runs for t, _, _ in TASKS)
    study_runs = load_runs(results, "bio", study=study)
    result_of = {str(d): r for d, r in zip(study_runs["dir"], study_runs["result"], strict=True)}
    key_of = {str(row["dir"]): _vocab_key(result_of[str(row["dir"])]) for row, _ in runs}
    keys = list(dict.fromkeys(key_of[str(row["dir"])] for row, _ in runs if row["method"] == "scale-route"))
    panel_keys = keys if study != "vocab" and len(keys) > 1 else [None]
    ncols = 3 if routed else 2
    fig, axes = plt.subplots(len(panel_keys), ncols, figsize=(4.3 * ncols + 1.8, 3.9 * len(panel_keys)),
                             squeeze=False)
    colors = dict(zip((str(row["dir"]) for row, _ in runs), _colors(len(runs)), strict=True))
    notes = []
    for ax_row, key in zip(axes, panel_keys, strict=True):
        mine = [(row, m) for row, m in runs if key is None or key_of[str(row["dir"])] == key]
        for row, m in mine:
            _route_study_run(ax_row, row, m, colors[str(row["dir"])], route if routed else None)
        refs = [k for k in keys if key in (None, k)]
        for i, k in enumerate(refs):
            r0 = next(result_of[str(row["dir"])] for row, _ in mine if key_of[str(row["dir"])] == k
                      and row["method"] == "scale-route")
            notes.append(_route_study_reference(ax_row, results, r0, {str(row["dir"]) for row, _ in mine},
                                                ("--", ":", "-.")[i % 3], len(refs) > 1))
        _route_study_axes(ax_row, result_of[str(mine[0][0]["dir"])], answers, routed,
                          f"\n{_vocab_text(key, result_of[str(mine[0][0]['dir'])])}" if key is not None else "")
    _figure_legend(fig, axes.flat)
    fig.text(0.5, -0.02, _route_study_caption(study, study_runs, "".join(notes), len(panel_keys) > 1),
             ha="center", va="top", fontsize=8, wrap=True)
    fig.tight_layout()
    stem = BIO_STUDIES.get(study, f"fig8_route_{study}")
    yield stem, _with_inputs(fig, study_runs, f"{stem}: one line per run of study '{study}'")


def _route_study_run(ax_row, row: pd.Series, m: pd.DataFrame, color, route) -> None:
    """One run of a Route study: its Task 0 / Task 1 accuracy (another method's reference run: dashed) and,
    with `route`, its share routed to preserve (Task 0 solid, Task 1 dashed)."""
    for ax, (task, _, _) in zip(ax_row, TASKS, strict=False):
        if _has(m, f"{task}/acc"):
            ax.plot(m["step"], 100 * m[f"{task}/acc"], color=color, marker=".", ms=2, lw=1.3,
                    ls="-" if row["method"] == "scale-route" else "--", label=row["setting"])
            _band(ax, m, "step", f"{task}/acc", color, 100)
    if route is not None:
        for task, ls in (("task0", "-"), ("task1", "--")):
            y = route(m, task)
            if y is not None:
                ax_row[2].plot(m["step"], 100 * y, color=color, ls=ls, marker=".", ms=2, lw=1.2)


def _route_study_reference(ax_row, results: Path | Sequence[Path], r0: dict, drawn: set[str], ls,
                           several: bool) -> str:
    """The FFT reference trained like r0 (its vocabulary rows included), black, on the accuracy panels: the mean
    over its replicates (`several`: one of several in the panel, its vocabulary in its label).
    Nothing when those runs are already drawn as the study's own lines."""
    ref, note = _fft_reference(results, r0)
    if ref is None:
        return note
    if ref["dirs"] <= drawn:
        return note.rstrip(".") + " (the study's own FFT line)."
    label = ref["label"] + (f", {_vocab_text(_vocab_key(r0), r0)}" if several else "")
    for ax, (task, _, _) in zip(ax_row, TASKS, strict=False):
        curve = ref["curves"][f"{task}/acc"]
        if curve is not None:  # the mean alone: a band over 2-3 bases would cover the panel
            ax.plot(curve["step"], 100 * curve["mean"], color="black", ls=ls, lw=1, label=label)
    return note


def _route_study_axes(ax_row, r0: dict, answers: bool, routed: bool, suffix: str) -> None:
    """Titles, labels, limits and the chance floor of one row of a Route study's panels."""
    prior = r0.get("priors", {}).get("task0_heldout", {}).get("pooled")
    if prior is not None:
        ax_row[0].axhline(100 * prior, color="grey", ls=":", lw=1, label="Task 0 chance floor")
    ax_row[0].set_title("(a) Task 0 (held-out) accuracy" + suffix, fontsize=10)
    ax_row[1].set_title("(b) Task 1 accuracy" + suffix, fontsize=10)
    ax_row[0].set_ylabel("first-token acc. (%)")
    if routed:
        where = "at the answer position" if answers else "(all tokens)"
        ax_row[2].set_title(f"(c) routed to preserve {where}" + suffix, fontsize=10)
        ax_row[2].set_ylabel("answer positions (%)" if answers else "tokens (%)")
        ax_row[2].plot([], [], color="grey", ls="-", label="Task 0 slice")
        ax_row[2].plot([], [], color="grey", ls="--", label="Task 1 slice")
    for ax in ax_row:
        ax.set_ylim(-3, 103)
        ax.set_xlabel("Task 1 step")
        ax.grid(alpha=0.3)


def _route_study_caption(study: str, study_runs: pd.DataFrame, fft_note: str, split: bool) -> str:
    """The caption of a Route study's figure: what varies, the fixed options, the reference lines."""
    routes = study_runs[study_runs["method"] == "scale-route"]
    r0 = (routes if len(routes) else study_runs).iloc[0]["result"]
    swept = {"tau": "the router threshold tau", "router": "what the router compares",
             "vocab": "the embedding/head rows"}.get(study, study)
    fixed = {k: v for k, v in (r0.get("method_options") or {}).items() if k != study}
    if study != "tau" and len({_tau(r) for r in routes["result"]}) > 1:
        fixed.pop("tau", None)  # not one value across the runs: the table has each
    options = "; options " + ", ".join(l_fp_text(v, r0) if k == "l_fp" else f"{k}={_fmt_option(v)}"
                                        for k, v in fixed.items()) if fixed else ""
    others = sorted({LABELS.get(m, m) for m in study_runs["method"] if m != "scale-route"})
    refs = f" Dashed coloured lines: {', '.join(others)} runs trained like the study's runs." if others else ""
    rows = (" A row of panels per vocabulary size (its titles), each with the FFT reference trained on those "
            "rows." if split else "")
    band = " Black: FFT reference (the mean over its replicates when it has several)."
    return (f"SCALE-Route, study '{study}': {swept} varies, one line per run{options}." + refs + rows + band
            + fft_note + "\n" + _bio_caption(r0))


def fig_route_studies(results: Path | Sequence[Path], out: Path) -> list[Path]:
    """Fig. 8 per biography Route study present (tau, router, vocab, any other bio study), with its table."""
    return [p for study in study_names(results, "bio") for p in fig_route_study(results, out, study)]


# ---------------------------------------------------------------------------------------------------------
# Paired differences: methods trained on the same base (same base seed, preset and non-method config)

PAIR_REFERENCE = "scale-route"  # each other method is compared with it: reference - other, per base
PAIRED = {"bio": (("task0_full_end", "final.task0_heldout.acc"), ("task1_full_end", "final.task1.acc")),
          "cpt": (("old_ppl_end", "summary.old_ppl_end"), ("new_ppl_end", "summary.new_ppl_end"))}
NO_INTERVAL = "fewer than 2 bases: interval cannot be computed"


def _per_base(g: pd.DataFrame, path: str) -> dict[int, float]:
    """A replicate group's value per base seed (the mean over its run seeds on that base)."""
    return {b: t_interval(_get(r, path) for r in sub["result"]).mean for b, sub in g.groupby("base_seed")}


def paired_table(results: Path | Sequence[Path], experiment: str) -> pd.DataFrame:
    """Per pair of replicate groups on the same bases (SCALE-Route and each other method) and metric: the
    per-base differences a - b and their mean with a 95% t interval over the bases shared."""
    runs, rows = load_runs(results, experiment), []
    for _, share in runs.groupby("pair", sort=False):
        reps = replicate_groups(share)
        for a in (g for g in reps if g.iloc[0]["method"] == PAIR_REFERENCE):
            for b in (g for g in reps if g.iloc[0]["method"] != PAIR_REFERENCE):
                rows += [_paired_row(a, b, col, path) for col, path in PAIRED[experiment]]
    return pd.DataFrame(rows)


def _paired_row(a: pd.DataFrame, b: pd.DataFrame, col: str, path: str) -> dict:
    va, vb = _per_base(a, path), _per_base(b, path)
    bases = sorted(set(va) & set(vb))
    diffs = [va[x] - vb[x] for x in bases]
    iv = t_interval(diffs)
    return {"preset": a.iloc[0]["preset"], "a": group_label(a.iloc[0]), "b": group_label(b.iloc[0]),
            "metric": col, "n_bases": len(bases), "bases": ", ".join(map(str, bases)),
            "a_runs": int(a["base_seed"].isin(bases).sum()), "b_runs": int(b["base_seed"].isin(bases).sum()),
            "a_mean": t_interval(va[x] for x in bases).mean, "b_mean": t_interval(vb[x] for x in bases).mean,
            "diff_mean": iv.mean, "diff_ci_lo": iv.lo, "diff_ci_hi": iv.hi,
            "interval": iv.note if len(bases) >= 2 else (NO_INTERVAL if bases else "no base seed shared"),
            "per_base": "; ".join(f"{x}: {d:+.6g}" for x, d in zip(bases, diffs, strict=True))}


PAIRED_CAPTION = ("Paired differences a - b of runs on the same base (same base seed, preset and config outside "
                  "the seeds and per-method options): per base seed the difference of the two methods' values (each "
                  "the mean over its run seeds on that base), then their mean over the bases with the 95% "
                  "Student-t interval (diff_ci_lo, diff_ci_hi: mean ± t_0.975,n-1 · s/√n, n = n_bases); a_mean, "
                  "b_mean: each method's mean over the same bases. {what}")


def _summary_tables(results: Path | Sequence[Path], out: Path) -> list[Path]:
    """table_bio, table_cpt (means over replicates with t intervals) and paired_bio, paired_cpt."""
    written = []
    for exp, table, metrics, what in (("bio", bio_table, BIO_METRICS, BIO_TABLE_NOTE),
                                      ("cpt", cpt_table, CPT_METRICS, "")):
        df, runs = table(results), load_runs(results, exp)
        if len(df):
            written += write_table(df, out, f"table_{exp}", shown=shown_aggregate(df, metrics),
                                   caption=f"{AGG_CAPTION} {what}".strip(),
                                   inputs=inputs_text(runs, f"table_{exp}: one row per replicate group"))
        paired = paired_table(results, exp)
        if len(paired):
            note = {"bio": "Metrics: full-range final accuracy (final.task0_heldout.acc, final.task1.acc).",
                    "cpt": "Metrics: final forgetting (old) and learning (new) perplexity."}[exp]
            written += write_table(paired, out, f"paired_{exp}", float_fmt="{:.4f}",
                                   caption=PAIRED_CAPTION.format(what=note),
                                   inputs=inputs_text(runs, f"paired_{exp}: runs compared per base seed"))
    return written


BIO_TABLE_NOTE = ("task0_full_end, task1_full_end: full-range final accuracy (result.json final.*.acc); task0_start/"
                  "min/end, task1_end: accuracy on the evaluation slices, with SE = sqrt(p(1-p)/q), the binomial "
                  "standard error of one slice evaluation of q questions (slice_people x attributes) at the shown "
                  "value (blank when q is not recorded).")


# ---------------------------------------------------------------------------------------------------------
# The learning-forgetting frontier (issue #18 item 3): one method at several stage-3 learning rates. Runs of a
# method that differ only in their rate (config.lr_scale, config.stage3.lr, cpt's per-method config.lr) are
# separate replicate groups; here they form one line of points, one point per rate.

# experiment -> (x: what was learned, y: what was kept), each (column, result.json path, axis label)
FRONTIER = {
    "bio": (("task1_full", "final.task1.acc", "Task 1 learned: full-range final accuracy (%)"),
            ("task0_full", "final.task0_heldout.acc", "Task 0 retained: held-out full-range final accuracy (%)")),
    "cpt": (("new_ppl_end", "summary.new_ppl_end", "learning: new-domain perplexity at the end (log scale)"),
            ("old_ppl_end", "summary.old_ppl_end", "forgetting: old-domain perplexity at the end (log scale)")),
}
THRESHOLDS = (0.5, 0.8)  # Task 0 accuracy when Task 1 accuracy first reaches these (bio)
FRONTIER_CAPTION = (
    "Each point: one method at one learning rate (result.json `lr`, the rate its Task 1 / new-domain training "
    "used), the mean over its replicates (runs with other seeds) with the 95% Student-t interval in both "
    "directions (mean ± t_0.975,n-1 · s/√n; none for n = 1). Points of a method (with its options and the rest of "
    "the config equal) are joined in learning-rate order where it has >= 2 rates; a method with one rate is a "
    "point alone. Each point is labelled with its rate (and n when >= 2).")


def _threshold_column(threshold: float) -> str:
    return f"task0_at_task1_{round(100 * threshold)}"


def _frontier_config(r: dict) -> dict:
    """What a frontier line's runs share: the config without seeds, method tables and the stage-3 rate."""
    rest = {k: v for k, v in _config_rest(r, pair=True).items() if k not in METHOD_KEYS}
    if isinstance(rest.get("stage3"), dict):
        rest["stage3"] = {k: v for k, v in rest["stage3"].items() if k != "lr"}
    return rest


def _short_hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:8]


def frontier_runs(results: Path | Sequence[Path], experiment: str) -> pd.DataFrame:
    """The main runs with their frontier `line` (preset, config outside seeds, rates and method tables, method,
    method options) and `point` (line and lr to 6 significant digits); one run per point and seed pair (the
    newest); `setting` what tells a line from the preset's other lines of its method, `line_label` its name."""
    runs = load_runs(results, experiment)
    ok = [isinstance(r["lr"], int | float) and not isinstance(r["lr"], bool) and math.isfinite(r["lr"])
          for r in runs["result"]]
    for f in runs[[not x for x in ok]]["dir"] if len(runs) else []:
        _skip(Path(f) / "result.json", f"result {Path(f) / 'result.json'}: its lr is not a number")
    runs = runs[ok].copy() if len(runs) else runs
    if runs.empty:
        return runs
    runs["front"] = [_short_hash([experiment, r["preset"], _frontier_config(r)]) for r in runs["result"]]
    runs["line"] = [_short_hash([f, r["method"], r.get("method_options") or {}])
                    for f, r in zip(runs["front"], runs["result"], strict=True)]
    runs["lr"] = [float(r["lr"]) for r in runs["result"]]
    runs["point"] = runs["line"] + runs["lr"].map(lambda v: f"@{v:.6g}")
    newest = runs.sort_values("date", kind="stable").drop_duplicates(["point", "base_seed", "run_seed"], keep="last")
    runs = runs.loc[[i for i in runs.index if i in newest.index]]
    runs["setting"] = _frontier_settings(runs)
    runs["line_label"] = [group_label(row) for _, row in runs.iterrows()]
    return runs.sort_values(["preset", "order", "setting", "lr"], kind="stable").reset_index(drop=True)


def _frontier_settings(runs: pd.DataFrame, most: int = 4) -> pd.Series:
    """Per run, what tells its frontier line from the preset's others: config keys that differ across the
    preset's lines and method options that differ across the method's lines ('' if none)."""
    labels = {}
    for _, g in runs.drop_duplicates("line").groupby("preset", sort=False):
        fronts = {row["front"]: _flat(_frontier_config(row["result"])) for _, row in g.iterrows()}
        keys = _varying(list(fronts.values()))
        for _, row in g.iterrows():
            same = [_flat(r.get("method_options") or {}) for r in g[g["method"] == row["method"]]["result"]]
            opts = _flat(row["result"].get("method_options") or {})
            parts = [f"{k}={fronts[row['front']].get(k, 'unset')}" for k in keys]
            parts += [f"{k}={opts.get(k, 'unset')}" for k in _varying(same)]
            label = ", ".join(parts[:most]) + (f", +{len(parts) - most} more" if len(parts) > most else "")
            labels[row["line"]] = label.replace('"', "")
    return runs["line"].map(labels)


def _task0_when(m: pd.DataFrame | None, threshold: float) -> tuple[float, float] | None:
    """(step, Task 0 accuracy) at the first evaluated step where Task 1 accuracy reaches `threshold`, or None
    (never reached, or Task 0 not evaluated at that step)."""
    if m is None or "task1/acc" not in m or "task0/acc" not in m:
        return None
    hit = m[m["task1/acc"].notna() & (m["task1/acc"] >= threshold)]
    if hit.empty or pd.isna(hit["task0/acc"].iloc[0]):
        return None
    return float(hit["step"].iloc[0]), float(hit["task0/acc"].iloc[0])


def _threshold_columns(g: pd.DataFrame) -> dict:
    """Per threshold: Task 0 when Task 1 first reaches it, mean and t interval over the runs that reached it
    (`_reached` of `curves`, the runs with Task 0 and Task 1 curves), and the mean step it happened at."""
    curves = [m for m in map(_metrics_or_none, g["dir"]) if m is not None and "task1/acc" in m and "task0/acc" in m]
    rec: dict = {"curves": len(curves)}
    for threshold in THRESHOLDS:
        col = _threshold_column(threshold)
        hits = [h for h in (_task0_when(m, threshold) for m in curves) if h is not None]
        iv = t_interval(v for _, v in hits)
        rec |= {col: iv.mean, f"{col}_ci_lo": iv.lo, f"{col}_ci_hi": iv.hi, f"{col}_reached": len(hits),
                f"{col}_step": t_interval(step for step, _ in hits).mean}
    return rec


def frontier_table(results: Path | Sequence[Path], experiment: str, runs: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per frontier point (preset, method, setting, lr): n, seeds, then x and y of FRONTIER as mean
    with 95% t interval (`_ci_lo`, `_ci_hi`); bio also Task 0 when Task 1 first reaches each of THRESHOLDS."""
    runs = frontier_runs(results, experiment) if runs is None else runs
    rows = []
    for _, g in runs.groupby("point", sort=False) if len(runs) else []:
        first = g.iloc[0]
        rec = {"preset": first["preset"], "method": first["method"], "setting": first["setting"],
               "line": first["line_label"], "lr": first["lr"], "n": len(g), "interval": interval_note(len(g)),
               "seeds": _seeds_text(g)}
        for col, path, _ in FRONTIER[experiment]:
            iv = t_interval(_get(r, path) for r in g["result"])
            rec |= {col: iv.mean, f"{col}_ci_lo": iv.lo, f"{col}_ci_hi": iv.hi}
        if experiment == "bio":
            rec |= _threshold_columns(g)
        rows.append(rec)
    return pd.DataFrame(rows)


def _shown_frontier(df: pd.DataFrame, experiment: str) -> pd.DataFrame:
    """The Markdown/LaTeX view of a frontier table: 'mean ± half-width' cells, threshold cells with how many runs
    reached the threshold and at which step on average."""
    fmt = "{:.3f}" if experiment == "bio" else "{:.2f}"
    cols = ["preset", "method"] + (["setting"] if df["setting"].astype(bool).any() else [])
    shown = df[cols].copy()
    shown["lr"] = df["lr"].map(lambda v: f"{v:g}")
    shown[["n", "seeds"]] = df[["n", "seeds"]]
    for col, _, _ in FRONTIER[experiment]:
        shown[col] = [_cell(row, col, fmt) for _, row in df.iterrows()]
    for threshold in THRESHOLDS if experiment == "bio" else ():
        col = _threshold_column(threshold)
        shown[f"Task 0 when Task 1 first reaches {threshold:g}"] = [
            (f"{_cell(row, col, fmt)} ({row[f'{col}_reached']} of {row['curves']} runs reached it; mean step "
             f"{row[f'{col}_step']:.0f})" if row[f"{col}_reached"] else f"never (0 of {row['curves']} runs)")
            for _, row in df.iterrows()]
    return shown


FRONTIER_TABLE_NOTE = {
    "bio": ("task1_full, task0_full: full-range final accuracy (final.task1.acc, final.task0_heldout.acc). "
            "task0_at_task1_<p>: per run, Task 0 (held-out slice, metrics.jsonl task0/acc) at the first "
            "evaluated step where Task 1 (task1/acc) reaches p/100; blank for a run that never does; mean and "
            "t interval over the runs that reached it (`_reached` of `curves` runs with both curves; `_step` their "
            "mean step)."),
    "cpt": "new_ppl_end, old_ppl_end: learning (new-domain) and forgetting (old-domain) perplexity at the end.",
}


def fig_frontier(results: Path | Sequence[Path], out: Path) -> list[Path]:
    """The learning-forgetting frontiers frontier_bio and frontier_cpt, each with its table."""
    written = []
    for experiment in ("bio", "cpt"):
        runs = frontier_runs(results, experiment)
        table = frontier_table(results, experiment, runs)
        if table.empty:
            continue
        written += _save_all(draw_frontier(results, experiment, table, runs), out)
        written += write_table(table, out, f"frontier_{experiment}", shown=_shown_frontier(table, experiment),
                               caption=f"{FRONTIER_CAPTION} {FRONTIER_TABLE_NOTE[experiment]}",
                               inputs=inputs_text(_as_groups(runs), f"frontier_{experiment}: one row per point"))
    return written


def _as_groups(runs: pd.DataFrame) -> pd.DataFrame:
    """Frontier runs with their point as the replicate group (for inputs_text)."""
    return runs.assign(group=runs["point"]) if len(runs) else runs


def draw_frontier(results: Path | Sequence[Path], experiment: str, table: pd.DataFrame | None = None,
                  runs: pd.DataFrame | None = None) -> Drawn:
    """The frontier figure of an experiment: a panel per preset, a line of points per method (and setting)."""
    runs = frontier_runs(results, experiment) if runs is None else runs
    table = frontier_table(results, experiment, runs) if table is None else table
    if table.empty:
        return
    presets = list(dict.fromkeys(table["preset"]))
    fig, axes = plt.subplots(1, len(presets), figsize=(6.2 * len(presets), 5.0), squeeze=False)
    for ax, preset in zip(axes[0], presets, strict=True):
        _frontier_panel(ax, table[table["preset"] == preset], experiment)
        ax.set_title(f"preset '{preset}'", fontsize=10)
    _figure_legend(fig, axes[0])
    better = ("Upper right is better: Task 1 learned while Task 0 is kept. Error bars are cut at 0 and 100%, "
              "the range of an accuracy (the table has the full intervals)." if experiment == "bio" else
              "Lower left is better: new domain learned (low learning PPL) while the old one is kept (low "
              "forgetting PPL); an interval reaching below 1 is cut at 1, the lowest perplexity.")
    r0 = runs.iloc[0]["result"]
    fig.text(0.5, -0.02, f"{FRONTIER_CAPTION} {better}\n{_caption(r0)}", ha="center", va="top", fontsize=8,
             wrap=True)
    fig.tight_layout()
    yield f"frontier_{experiment}", _with_inputs(fig, _as_groups(runs), f"frontier_{experiment}: a point per rate")


def _frontier_panel(ax, table: pd.DataFrame, experiment: str) -> None:
    """One preset's frontier: per line its points in lr order (joined when >= 2) with t-interval error bars."""
    (x, _, xlabel), (y, _, ylabel) = FRONTIER[experiment]
    scale, log = (100.0, False) if experiment == "bio" else (1.0, True)
    styles: dict[str, int] = {}
    for _, pts in table.groupby("line", sort=False):
        pts = pts.sort_values("lr")
        method = pts["method"].iloc[0]
        styles[method] = styles.get(method, -1) + 1  # a method's second line (another setting): another style
        ls = LINESTYLES[styles[method] % len(LINESTYLES)] if len(pts) >= 2 else "none"
        ax.errorbar(scale * pts[x], scale * pts[y], xerr=_error_bars(pts, x, scale, log),
                    yerr=_error_bars(pts, y, scale, log), marker="o", ms=5, ls=ls, lw=1.3, capsize=3,
                    elinewidth=0.9, color=COLORS.get(method), label=pts["line"].iloc[0])
        for _, p in pts.iterrows():
            ax.annotate(f"{p['lr']:g}" + (f" (n={p['n']})" if p["n"] >= 2 else ""), (scale * p[x], scale * p[y]),
                        textcoords="offset points", xytext=(5, 4), fontsize=7, color=COLORS.get(method))
    if log:
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis, col in ((ax.xaxis, x), (ax.yaxis, y)):  # plain numbers; minor ticks labelled within a decade
            axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            narrow = table[col].max() < 10 * table[col].min()
            axis.set_minor_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}") if narrow
                                     else matplotlib.ticker.NullFormatter())
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, which="both")


def _error_bars(pts: pd.DataFrame, col: str, scale: float, log: bool) -> list[list[float]]:
    """[below, above] the means of a column: its t interval (NaN for n = 1: no bar), cut where the quantity
    ends: perplexity (log axis) at 1, accuracy at 0 and 1."""
    lo, hi = pts[f"{col}_ci_lo"].clip(lower=1.0 if log else 0.0), pts[f"{col}_ci_hi"]
    hi = hi if log else hi.clip(upper=1.0)
    return [list(scale * (pts[col] - lo)), list(scale * (hi - pts[col]))]


# ---------------------------------------------------------------------------------------------------------
# SCALE-Route's mechanism (issue #18 item 4): how much of each path's logits falls on vocabulary rows that are
# never a training target, at the answer positions, next to where the router sends those positions.

NEVER_KEY = "{task}/answer/never_share_{path}/mean"
MECHANISM_PATHS = (("preserve", "-", "tab:green"), ("adapt", "--", "tab:purple"))
MECHANISM_CAPTION = (
    "SCALE-Route at the scored answer positions (the last prompt token) of each evaluation. (a, b) Share of the "
    "squared logit norm that falls on vocabulary rows never a training target (result.json never_target_rows of "
    "vocab.model rows), for the preserve path's logits (green, solid) and the adapt path's (purple, dashed), "
    "averaged over the "
    "answer positions of the Task 0 (held-out) and Task 1 slices (metrics.jsonl <task>/answer/never_share_<path>/"
    "mean; q05-q95 over the positions are recorded beside it). (c) Share of answer positions routed to preserve. "
    "(d) The router's score, mean over answer positions; tau dotted (preserve above). A row per Route setting "
    "(vocabulary rows, tau, router), from the main runs and the biography studies; a run found in several folders "
    "counts once. (a, b) share one scale per column, up to a quarter above the highest mean; a wider band is cut.")


def _has_never_share(m: pd.DataFrame) -> bool:
    return any(_has(m, NEVER_KEY.format(task=t, path=p)) for t, _, _ in TASKS for p, _, _ in MECHANISM_PATHS)


def route_runs(results: Path | Sequence[Path], experiment: str) -> pd.DataFrame:
    """Every SCALE-Route run of an experiment: the main runs, then each study's (load_runs rows)."""
    frames = [load_runs(results, experiment)] + [load_runs(results, experiment, study=s)
                                                 for s in study_names(results, experiment)]
    frames = [f[f["method"] == "scale-route"] for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=RUN_COLUMNS)


def _mechanism_groups(results: Path | Sequence[Path]) -> list[tuple[pd.DataFrame, list[pd.DataFrame]]]:
    """SCALE-Route runs (main and every biography study) that recorded the never-target share, as replicate
    groups (config without seeds and method options; one run per seed pair, the newest): (runs, their metrics)."""
    runs = route_runs(results, "bio")
    if runs.empty:
        return []
    runs["group"] = [_config_id(r) for r in runs["result"]]
    runs = runs.sort_values("date", kind="stable").drop_duplicates(["group", "base_seed", "run_seed"], keep="last")
    out = []
    for _, g in runs.groupby("group", sort=False):
        picked = [(i, m) for i, m in zip(g.index, map(_metrics_or_none, g["dir"]), strict=True)
                  if m is not None and _has_never_share(m)]
        if picked:
            out.append((g.loc[[i for i, _ in picked]], [m for _, m in picked]))
    out.sort(key=lambda gm: _mechanism_key(gm[0].iloc[0]["result"]))
    return out


def _mechanism_key(r: dict) -> tuple:
    """Route settings in order: preset, vocabulary rows (the tokenizer's size first), tau, router."""
    key = _vocab_key(r)
    router = (r.get("method_options") or {}).get("router", "logit")
    return (r["preset"], 0 if key == "tokenizer" else key, _tau(r) if _tau(r) is not None else -math.inf,
            ROUTER_ORDER.index(router) if router in ROUTER_ORDER else len(ROUTER_ORDER), str(router))


def _mechanism_label(r: dict, presets: int) -> str:
    """A Route setting's name: its vocabulary rows (and how many are never a target), tau and router."""
    never = r.get("never_target_rows")
    label = _vocab_text(_vocab_key(r), r) + (f" ({never:,} never a target)" if isinstance(never, int) else "")
    tau = _tau(r)
    label += (f", tau={tau:g}" if tau is not None else "") + f", router={(r.get('method_options') or {}).get('router', 'logit')}"
    return (f"{r['preset']}: " if presets > 1 else "") + label


def fig_route_mechanism(results: Path | Sequence[Path], out: Path) -> list[Path]:
    """route_mechanism: never-target logit share per path, answer routing and router score (skipped when no run
    recorded the never-target share)."""
    return _save_all(draw_route_mechanism(results), out)


def draw_route_mechanism(results: Path | Sequence[Path]) -> Drawn:
    """The mechanism figure: a row per Route setting group, the mean over its replicates with t bands."""
    groups = _mechanism_groups(results)
    if not groups:
        return
    presets = len({g.iloc[0]["preset"] for g, _ in groups})
    labels = [_mechanism_label(g.iloc[0]["result"], presets) for g, _ in groups]
    for i, (g, _) in enumerate(groups):  # settings that differ elsewhere (other config): their hash tells
        if labels.count(labels[i]) > 1:
            labels[i] += f" #{g.iloc[0]['group']}"
    scored = any(_has(m, f"{t}/answer/route_score/mean") for _, ms in groups for m in ms for t, _, _ in TASKS)
    ncols = 4 if scored else 3
    fig, axes = plt.subplots(len(groups), ncols, figsize=(4.2 * ncols + 1.8, 2.9 * len(groups) + 0.8),
                             squeeze=False, sharey="col")
    for ax_row, (g, ms), label in zip(axes, groups, labels, strict=True):
        _mechanism_row(ax_row, ms, _n_label(label, len(ms)), _tau(g.iloc[0]["result"]))
    for ax in axes[-1]:
        ax.set_xlabel("Task 1 step")
    for col in (0, 1):  # shares from 0 to a quarter above the highest mean (a wide band of few replicates: cut)
        means = [float(v) for ax in axes[:, col] for ln in ax.get_lines() for v in ln.get_ydata() if math.isfinite(v)]
        axes[0, col].set_ylim(0, min(100.0, 1.25 * max(means, default=0) or 1.0))
    _figure_legend(fig, axes.flat)
    band = "\n" + BAND_NOTE if any(len(ms) >= 2 for _, ms in groups) else ""
    fig.text(0.5, -0.01, MECHANISM_CAPTION + band + "\n" + _bio_caption(groups[0][0].iloc[0]["result"]),
             ha="center", va="top", fontsize=8, wrap=True)
    fig.tight_layout()
    runs = pd.concat([g for g, _ in groups])
    yield "route_mechanism", _with_inputs(fig, runs, "route_mechanism: a row per Route setting group")


def _mechanism_row(ax_row, ms: list[pd.DataFrame], label: str, tau: float | None) -> None:
    """One Route setting: never-target share per path (Task 0, Task 1), answer routing, router score."""
    for ax, (task, task_label, _) in zip(ax_row[:2], TASKS, strict=True):
        for path, ls, color in MECHANISM_PATHS:
            curve = mean_curve(ms, NEVER_KEY.format(task=task, path=path))
            if curve is not None:
                _draw_mean(ax, curve, 100, color=color, ls=ls, lw=1.4, label=f"{path} path")
        panel = f"({'ab'[task != 'task0']}) {task_label}: never-target share"
        ax.set_title(f"{label}\n{panel}" if task == "task0" else panel, fontsize=8, loc="left")
        ax.set_ylabel("squared logit norm on never-target rows (%)", fontsize=8)
    for task, task_label, color in TASKS:
        ls = "-" if task == "task0" else "--"
        curve = mean_curve(ms, f"{task}/answer/route_preserve")
        if curve is not None:
            _draw_mean(ax_row[2], curve, 100, color=color, ls=ls, lw=1.4, label=f"{task_label} slice")
        curve = mean_curve(ms, f"{task}/answer/route_score/mean") if len(ax_row) > 3 else None
        if curve is not None:
            _draw_mean(ax_row[3], curve, color=color, ls=ls, lw=1.4, label=f"{task_label} slice")
    ax_row[2].set_title("(c) answer positions routed to preserve", fontsize=8, loc="left")
    ax_row[2].set_ylabel("answer positions (%)", fontsize=8)
    ax_row[2].set_ylim(-3, 103)
    if len(ax_row) > 3:
        if tau is not None:
            ax_row[3].axhline(tau, color="tab:red", ls=":", lw=1.2, label="tau (preserve above)")
        ax_row[3].set_title("(d) router score at the answer position", fontsize=8, loc="left")
        ax_row[3].set_ylabel("router cosine (mean)", fontsize=8)
    for ax in ax_row:
        ax.grid(alpha=0.3)


# SCALE-Route's mechanism in continual pre-training (issue #20 item 3): at every evaluated position of both
# domains, the router's score and each path's share of its logit norm on the vocabulary rows the new-domain
# training text never uses (train-cpt with eval.never_tokens > 0).

CPT_MECHANISM_CAPTION = (
    "SCALE-Route in continual pre-training, at every position of each evaluation set (old = forgetting text, new = "
    "learning text): share of positions routed to preserve (the averaged branch); the router's score (cosine of the "
    "two paths' logits, or of their probability vectors for the prob router), mean and 5/50/95% quantiles over "
    "the positions; and, for each path's logits (original channels), the share of the squared norm on vocabulary "
    "rows absent from the new-domain training text (never_rows of the rows), mean over positions "
    "(metrics.jsonl <set>/route_score/*, <set>/never_share_<path>/mean). One row per run and evaluation step, main "
    "runs and studies; a position goes to preserve when its score is above tau; lr: the run's learning rate.")


def route_mechanism_cpt(results: Path | Sequence[Path]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(table, runs): a row per SCALE-Route CPT run that measured its never rows, per evaluation step and set."""
    runs = route_runs(results, "cpt")
    runs = runs[~runs["dir"].map(lambda d: Path(d).resolve()).duplicated()]  # a referenced run counts once
    rows, used = [], []
    for i, run in runs.iterrows():
        r, m = run["result"], _metrics_or_none(run["dir"])
        never = (r.get("data") or {}).get("never_rows")
        if m is None or not isinstance(never, dict) or not _has(m, "new/never_share_preserve/mean"):
            continue
        used.append(i)
        opts = r.get("method_options") or {}
        for _, rec in m.iterrows():
            for split in ("old", "new"):
                row = {"preset": r["preset"], "lr": r.get("lr"), "tau": _tau(r), "router": opts.get("router", "logit"),
                       "base_seed": run["base_seed"], "run_seed": run["run_seed"], "step": int(rec["step"]),
                       "set": split, "never_rows": f"{never.get('never_rows')} of {never.get('rows')}"}
                for key, col in (("route_preserve", "preserve_share"), ("route_score/mean", "score_mean"),
                                 ("route_score/q05", "score_q05"), ("route_score/q50", "score_q50"),
                                 ("route_score/q95", "score_q95"), ("never_share_preserve/mean", "never_share_preserve"),
                                 ("never_share_adapt/mean", "never_share_adapt")):
                    row[col] = rec.get(f"{split}/{key}", math.nan)
                rows.append(row)
    return pd.DataFrame(rows), runs.loc[used]


def table_route_mechanism_cpt(results: Path | Sequence[Path], out: Path) -> list[Path]:
    df, runs = route_mechanism_cpt(results)
    if df.empty:
        return []
    return write_table(df, out, "route_mechanism_cpt", float_fmt="{:.4f}", caption=CPT_MECHANISM_CAPTION,
                       inputs=inputs_text(runs, "route_mechanism_cpt: SCALE-Route CPT runs with never rows measured"))


def plot_all(results: Path | Sequence[Path], out: Path) -> list[Path]:
    """Every figure and table the results folders have data for (the one entry point of `scalecl plot`); the
    runs left out for a missing or malformed file are in SKIPPED afterwards."""
    SKIPPED.clear()
    STALE.clear()
    _BATCH[:] = [OwnedFiles(out, "scalecl plot", deferred=True)]
    try:
        fig8(results, out)
        _summary_tables(results, out)
        harness = table2(results)
        if len(harness):
            write_table(harness, out, "table2_harness")
        for fig in (fig9, fig4, fig5, fig6, fig7, fig_route_studies, fig_train_loss, fig_lr_schedule, fig_routing,
                    fig_router_score, fig_frontier, fig_route_mechanism, table_route_mechanism_cpt):
            fig(results, out)
        written = _BATCH[0].flush()  # every name was checked as it was drawn, and is again before the first write
        # its own earlier outputs not drawn again (none when nothing was drawn: the command then fails)
        STALE[:] = _BATCH[0].prune({p.name for p in written}) if written else []
        return written
    finally:
        _BATCH.clear()

"""Results folder -> pandas -> the paper's figures and tables. Pure functions of the results files:
nothing here trains or needs a GPU, so every figure can be rebuilt at any time with `scalecl plot`."""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from .errors import ScaleclError  # noqa: E402
from .files import OwnedFiles  # noqa: E402
from .methods.base import METHOD_ORDER  # noqa: E402
from .readers import read_json, read_jsonl  # noqa: E402

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


def load_runs(results: Path | Sequence[Path], experiment: str, study: str | None = None) -> pd.DataFrame:
    """One row per finished run (result.json) of an experiment; the newest run per (preset, method) kept.

    Study sweeps live under `.../studies/<study>/`: they are left out of the main figures and, with `study=`,
    loaded alone (one row per run, since their options differ). Several results folders may be given.
    """
    rows, seen = [], set()
    for root in _roots(results):
        for f in sorted(root.rglob("result.json")):
            if _study_of(f) != study or f.resolve() in seen:  # nested folders given twice: each run once
                continue
            seen.add(f.resolve())
            r = _result_or_none(f)
            if r is None or r.get("experiment") != experiment:
                continue
            if _lacks(r):
                _skip(f, f"result {f} has no {_lacks(r)!r}")
                continue
            rows.append({"dir": f.parent, "preset": r["preset"], "method": r["method"],
                         "date": r.get("provenance", {}).get("date", ""), "result": r})
    if not rows:
        return pd.DataFrame(columns=["dir", "preset", "method", "date", "result"])
    df = pd.DataFrame(rows).sort_values("date", kind="stable")
    if study is None:
        df = df.drop_duplicates(["preset", "method"], keep="last")
    df["order"] = df["method"].map({m: i for i, m in enumerate(METHOD_ORDER)}).fillna(len(METHOD_ORDER))
    return df.sort_values(["preset", "order"], kind="stable").reset_index(drop=True)


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


def _owned(out: Path) -> OwnedFiles:
    """The figures folder: plot replaces only files it wrote there itself (scalecl.files.OwnedFiles)."""
    return OwnedFiles(out, "scalecl plot")


def _save(fig, out: Path, stem: str) -> list[Path]:
    owned = _owned(out)
    paths = []
    try:
        for ext in ("png", "pdf"):
            owned.check(f"{stem}.{ext}")  # before drawing: a user's file of that name is refused
            buf = io.BytesIO()
            fig.savefig(buf, format=ext, dpi=150, bbox_inches="tight")
            paths.append(owned.write(f"{stem}.{ext}", buf.getvalue()))  # never through a link
    finally:
        plt.close(fig)
    return paths


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
    """Paper Fig. 8 per preset: a panel per method, titled by its label, in method order."""
    runs = load_runs(results, "bio")
    for preset, group in runs.groupby("preset", sort=False):
        n = len(group)
        ncols = min(4, n)
        nrows = math.ceil(n / ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 2.9 * nrows + 0.8), squeeze=False,
                                 sharey=True)
        for ax, (_, row) in zip(axes.flat, group.iterrows(), strict=False):
            m = _metrics_with(row["dir"], "task0/acc", "task1/acc")
            if m is None:  # named in SKIPPED
                continue
            prior = row["result"]["priors"]["task0_heldout"]["pooled"]
            ax.plot(m["step"], 100 * m["task0/acc"], marker=".", ms=3, color="tab:blue", label="Task 0 (held-out)")
            ax.plot(m["step"], 100 * m["task1/acc"], marker=".", ms=3, color="tab:orange", label="Task 1")
            ax.axhline(100 * prior, color="grey", ls=":", lw=1, label="Task 0 chance floor")
            ax.set_title(LABELS.get(row["method"], row["method"]), fontsize=10)
            ax.set_ylim(-2, 102)
            ax.grid(alpha=0.3)
            ax.set_xlabel("Task 1 step")
        for ax in axes[:, 0]:
            ax.set_ylabel("first-token acc. (%)")
        for ax in list(axes.flat)[n:]:
            ax.axis("off")
        handles, labels = axes.flat[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="upper center", ncol=3, frameon=False, bbox_to_anchor=(0.5, 1.0))
        first = group.iloc[0]["result"]
        fig.text(0.5, -0.02, _bio_caption(first) + "\n" + PAPER_FIG8, ha="center", va="top", fontsize=8, wrap=True)
        fig.tight_layout(rect=(0, 0, 1, 0.95))
        yield f"fig8_bio_{preset}", fig


def bio_table(results: Path) -> pd.DataFrame:
    """Per method: Task 0 at start / minimum / end, Task 1 at end (slices), and full-range final accuracy."""
    runs = load_runs(results, "bio")
    rows = []
    for _, row in runs.iterrows():
        r = row["result"]
        s = r["summary"]
        rows.append({
            "preset": row["preset"], "method": row["method"], "trainable": r["trainable_params"], "lr": r["lr"],
            "task0_start": s["task0_start"], "task0_min": s["task0_min"], "task0_end": s["task0_end"],
            "task1_end": s["task1_end"], "task0_full_end": r["final"]["task0_heldout"]["acc"],
            "task1_full_end": r["final"]["task1"]["acc"], "task0_prior": r["priors"]["task0_heldout"]["pooled"],
        })
    return pd.DataFrame(rows)


def write_table(df: pd.DataFrame, out: Path, stem: str, float_fmt: str = "{:.3f}") -> list[Path]:
    """CSV (full precision), Markdown and LaTeX (rounded) versions of one table."""
    out.mkdir(parents=True, exist_ok=True)
    shown = df.copy()
    for c in shown.columns:
        if shown[c].dtype.kind == "f" and c != "lr":
            shown[c] = shown[c].map(lambda v: "" if pd.isna(v) else float_fmt.format(v))  # not recorded: blank
        elif shown[c].isna().any():
            shown[c] = shown[c].astype(object).where(shown[c].notna(), "")
    owned = _owned(out)
    for ext in ("csv", "md", "tex"):  # all three checked before the first is written
        owned.check(f"{stem}.{ext}")
    return [owned.write(f"{stem}.csv", df.to_csv(index=False)),
            owned.write(f"{stem}.md", shown.to_markdown(index=False) + "\n"),
            owned.write(f"{stem}.tex", shown.to_latex(index=False))]


# ---------------------------------------------------------------------------------------------------------
# Continual pre-training (paper Figs. 4, 5, 6, 7, 9)

COLORS = {m: c for m, c in zip(METHOD_ORDER, ("tab:red", "tab:purple", "tab:brown", "tab:orange", "tab:green",
                                               "tab:cyan", "tab:blue"), strict=True)}


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
    """Paper Fig. 9 per preset: old- and new-domain perplexity, a line per method."""
    for preset, group in load_runs(results, "cpt").groupby("preset", sort=False):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for _, row in group.iterrows():
            m = _metrics_with(row["dir"], "old/ppl", "new/ppl")
            if m is None:  # named in SKIPPED
                continue
            for ax, key in zip(axes, ("old/ppl", "new/ppl"), strict=True):
                ax.plot(m["step"], m[key], marker=".", ms=3, color=COLORS.get(row["method"]),
                        label=LABELS.get(row["method"], row["method"]))
        axes[0].set_title("(a) forgetting: old-domain perplexity")
        axes[1].set_title("(b) learning: new-domain perplexity")
        for ax in axes:
            ax.set_xlabel("training step")
            ax.set_ylabel("perplexity")
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.yaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
            ax.grid(alpha=0.3, which="both")
        axes[1].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
        fig.text(0.5, -0.02, _cpt_caption(group.iloc[0]["result"]), ha="center", va="top", fontsize=8, wrap=True)
        fig.tight_layout()
        yield f"fig9_cpt_{preset}", fig


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
        for _, row in group.iterrows():
            m = _metrics_with(row["dir"], "rep_cos", "old/ppl")
            if m is None:  # named in SKIPPED
                continue
            label = names[row["method"]]
            if row["method"] == "scale-adapt":
                label += f", l_fp={row['result']['method_options'].get('l_fp')}"
            axes[0].plot(m["step"], m["rep_cos"], marker=".", ms=3, color=COLORS[row["method"]], label=label)
            axes[1].plot(m["step"], m["old/ppl"], marker=".", ms=3, color=COLORS[row["method"]], label=label)
        axes[0].set_title("(a) representation forgetting")
        axes[0].set_ylabel("cosine of final hidden states (step 0 vs now)")
        axes[1].set_title("(b) forgetting perplexity (old domain)")
        axes[1].set_ylabel("perplexity")
        for ax in axes:
            ax.set_xlabel("training step")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.text(0.5, -0.02, _cpt_caption(group.iloc[0]["result"]), ha="center", va="top", fontsize=8, wrap=True)
        fig.tight_layout()
        yield f"fig4_width_vs_depth_{preset}", fig


def _study_label(study: str, opts: dict) -> str:
    if study == "init":
        return ",".join(i.upper() if i != "zero" else "0" for i in opts.get("init", ()))
    if study == "l_fp":
        return f"l_fp={opts.get('l_fp')}"
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


def _study_caption(fig: Figure, results: Path, study: str, df: pd.DataFrame, note: str = "") -> Figure:
    """Caption a study's figure (method + run settings) and lay it out."""
    r0 = load_runs(results, "cpt", study=study).iloc[0]["result"]
    fig.text(0.5, -0.02, f"{df['method'].iloc[0]}{note}; " + _cpt_caption(r0), ha="center", va="top", fontsize=8,
             wrap=True)
    fig.tight_layout()
    return fig


def _save_study(figures: Drawn, results: Path, out: Path, study: str) -> list[Path]:
    """Save a study's figure and write the study's table beside it (nothing when there is no figure)."""
    paths = _save_all(figures, out)
    if not paths:
        return []
    return paths + write_table(study_table(results, study).drop(columns="dir"), out, STUDY_TABLES[study])


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
    fig, axes = plt.subplots(len(variants), 2, figsize=(11, 4 * len(variants)), squeeze=False)
    for (ax_old, ax_new), variant in zip(axes, variants, strict=True):
        for _, row in df[df["variant"] == variant].iterrows():
            m = _metrics_with(row["dir"], "old/ppl", "new/ppl")
            if m is None:  # named in SKIPPED
                continue
            ax_old.plot(m["step"], m["old/ppl"], marker=".", ms=3, label=row["setting"])
            ax_new.plot(m["step"], m["new/ppl"], marker=".", ms=3, label=row["setting"])
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
    axes[0].plot(df["l_fp"], df["old_ppl_end"], marker="o", color="tab:red")
    axes[0].set_title("(a) forgetting PPL at the end")
    axes[1].plot(df["l_fp"], df["new_ppl_end"], marker="o", color="tab:blue")
    axes[1].set_title("(b) learning PPL at the end")
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
    for _, row in df.iterrows():
        m = _metrics_with(row["dir"], "old/ppl")
        if m is None:  # named in SKIPPED
            continue
        if "up_norm" in m:
            ax.plot(m["up_norm"], m["old/ppl"], marker=".", ms=4, label=f"W12 trains in {row['setting']}")
    ax.set_xlabel("average norm of upscaled weights (W12, W21, W22)")
    ax.set_ylabel("forgetting PPL (old domain)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    yield "fig7_collab_modules", _study_caption(fig, results, "collab", df, f", l_fp={df['l_fp'].iloc[0]}")


def cpt_table(results: Path) -> pd.DataFrame:
    rows = []
    for _, row in load_runs(results, "cpt").iterrows():
        r = row["result"]
        s = r["summary"]
        rows.append({"preset": row["preset"], "method": row["method"], "trainable": r["trainable_params"],
                     "lr": r["lr"], "old_ppl_start": s["old_ppl_start"], "old_ppl_end": s["old_ppl_end"],
                     "old_ppl_max": s["old_ppl_max"], "new_ppl_start": s["new_ppl_start"],
                     "new_ppl_end": s["new_ppl_end"], "rep_cos_end": s["rep_cos_end"]})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------------------
# Table 2: lm-evaluation-harness scores


def table2(results: Path) -> pd.DataFrame:
    """Harness scores per evaluated checkpoint, with the language averages and the paper's averages beside."""
    from .harness import PAPER_ROWS

    rows = []
    for f in sorted(f for root in _roots(results) for f in root.rglob("run.json")):
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
        df = pd.DataFrame(rows)
        if not df.empty and "step" in df:
            return df.drop_duplicates("step", keep="last").sort_values("step").reset_index(drop=True)
        why = f"{path} has no 'step' column"
    except (ScaleclError, TypeError, ValueError) as e:  # unreadable, or steps that do not sort
        why = str(e)
    _skip(path, why)
    return None


def load_train_log(run_dir: Path) -> pd.DataFrame | None:
    """The per-step training log (step, loss, lr, grad_norm, tokens, seconds, tokens_per_s), or None."""
    return _read_jsonl(Path(run_dir) / "train_log.jsonl")


def _metrics_or_none(run_dir: Path) -> pd.DataFrame | None:
    return _read_jsonl(Path(run_dir) / "metrics.jsonl")


def study_names(results: Path | Sequence[Path], experiment: str) -> list[str]:
    """The studies (folders under a `studies/`) that hold finished runs of an experiment, sorted."""
    names = set()
    for root in _roots(results):
        for f in root.rglob("result.json"):
            s = _study_of(f)
            if s is not None and (_result_or_none(f) or {}).get("experiment") == experiment:
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
    """One figure per group of runs: a per-step train_log.jsonl column against the step, a line per run."""
    for tag, study, runs in _groups(results, experiment):
        if column == "lr" and study is not None:
            continue  # a study's runs share one schedule; the main runs' figure shows it
        logs, missing = [], []
        for _, row in runs.iterrows():
            log = load_train_log(row["dir"])
            label = _setting(study, row["result"])
            if log is None or column not in log or log[column].isna().all():
                missing.append(label)
            else:
                logs.append((row, label, log))
        if not logs:
            continue
        colors = _colors(len(logs)) if study is not None else [COLORS.get(r["method"]) for r, _, _ in logs]
        fig, ax = plt.subplots(figsize=(8, 4.2))
        n_max = max(len(log) for _, _, log in logs)
        window = max(1, min(n_max // 4, max(SMOOTH_MIN, round(SMOOTH_FRACTION * n_max))))
        for i, ((_, label, log), color) in enumerate(zip(logs, colors, strict=True)):
            y = log[column].astype(float)
            if column == "loss":
                ax.plot(log["step"], y, color=color, alpha=0.2, lw=0.6)
                y = y.rolling(window, center=True, min_periods=1).mean()
                ax.plot(log["step"], y, color=color, lw=1.4, label=label)
            else:  # equal schedules coincide: a style per method keeps each visible
                ax.plot(log["step"], y, color=color, lw=1.6, ls=LINESTYLES[i % len(LINESTYLES)], label=label)
        vals = pd.concat([log[column] for _, _, log in logs]).astype(float).dropna()
        if len(vals) and vals.min() > 0 and vals.max() / vals.min() > LOG_RATIO[column]:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel(_step_label(experiment))
        ax.set_ylabel("training loss (per step)" if column == "loss" else "learning rate")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5),
                  title=study if study is not None else None)
        what = (f"Training loss per step (faint) and its centred running mean over {window} step(s) (bold)"
                if column == "loss" else "Learning rate per step as the schedule set it")
        where = " (stage 3, Task 1)" if experiment == "bio" else ""
        first = logs[0][0]["result"]
        title = f"{what}{where}, from train_log.jsonl" + (f"; study '{study}'" if study else "") + "."
        fig.text(0.5, -0.02, title + "\n" + _caption(first) + _missing_note(missing, "train_log.jsonl"),
                 ha="center", va="top", fontsize=8, wrap=True)
        fig.tight_layout()
        yield f"{stem}_{tag}", fig


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


def _route_series(m: pd.DataFrame, prefix: str, path: str) -> pd.Series | None:
    """Share of a slice's tokens routed to a path (`prefix/route_<path>`; Task 0 also reads legacy keys)."""
    for key in (f"{prefix}/route_{path}",) + ((f"route_{path}",) if prefix == "task0" else ()):
        if _has(m, key):
            return m[key]
    return None


def _answer_preserve(m: pd.DataFrame, task: str) -> pd.Series | None:
    key = f"{task}/answer/route_preserve"
    return m[key] if _has(m, key) else None


def _route_runs(runs: pd.DataFrame) -> list[tuple[pd.Series, pd.DataFrame]]:
    """SCALE-Route runs of a group with their metrics (runs without a metrics file are left out)."""
    picked = []
    for _, row in runs[runs["method"] == "scale-route"].iterrows():
        m = _metrics_or_none(row["dir"])
        if m is not None:
            picked.append((row, m))
    return picked


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
            picked = [(row, m) for row, m in _route_runs(runs)
                      if any(_route_series(m, p, "preserve") is not None
                             for p in ("task0", "task1", "old", "new"))]
            if not picked:
                continue
            answers = experiment == "bio" and any(_answer_preserve(m, t) is not None for _, m in picked
                                                  for t, _, _ in TASKS)
            ncols = 2 if answers else 1
            fig, axes = plt.subplots(len(picked), ncols, figsize=(5.6 * ncols + 1.6, 2.7 * len(picked) + 0.6),
                                     squeeze=False, sharey=True)
            sets = TASKS if experiment == "bio" else CPT_SETS
            for (row, m), ax_row in zip(picked, axes, strict=True):
                name = _setting(study, row["result"])
                for (prefix, set_label, color), lw in zip(sets, (2.4, 1.2), strict=True):  # equal: both show
                    for path, ls in PATHS:
                        y = _route_series(m, prefix, path)
                        if y is not None:
                            ax_row[0].plot(m["step"], 100 * y, ls=ls, lw=lw, color=color,
                                           label=f"{set_label}, {path}")
                    if answers:
                        y = _answer_preserve(m, prefix)
                        if y is not None:
                            for path, ls in PATHS:
                                ax_row[1].plot(m["step"], 100 * (y if path == "preserve" else 1 - y), ls=ls,
                                               lw=lw, color=color, label=f"{set_label}, {path}")
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
            fig.text(0.5, -0.01, what + (f"; study '{study}'." if study else ".") + "\n" + _caption(r0),
                     ha="center", va="top", fontsize=8, wrap=True)
            fig.tight_layout()
            yield f"routing_{tag}", fig


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
        for row, m in _route_runs(runs):
            if any(_score(m, t, "q50") is not None for t, _, _ in TASKS):
                picked.append((row, m))
            else:
                missing.append(_setting(study, row["result"]))
        if not picked:
            continue
        fig, axes = plt.subplots(len(picked), 2, figsize=(11.5, 2.7 * len(picked) + 0.6), squeeze=False,
                                 sharey=True)
        for (row, m), ax_row in zip(picked, axes, strict=True):
            name = _setting(study, row["result"])
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
                 + _bio_caption(r0)
                 + _missing_note(missing, "answer-position record"), ha="center", va="top", fontsize=8,
                 wrap=True)
        fig.tight_layout()
        yield f"router_score_{tag}", fig


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


def _fft_reference(results: Path | Sequence[Path], r0: dict) -> tuple[pd.DataFrame | None, str]:
    """The main FFT run trained like a study's runs (preset, data, stage-3 steps): metrics, caption note."""
    main = load_runs(results, "bio")
    fft = main[(main["preset"] == r0["preset"]) & (main["method"] == "fft")]
    if fft.empty:
        return None, " No main FFT run of this preset to draw as a reference."
    ref = fft.iloc[-1]["result"]
    steps = ref["config"]["stage3"]["steps"]
    if steps != r0["config"]["stage3"]["steps"] or ref.get("data") != r0.get("data"):
        return None, (f" The main FFT run ({Path(fft.iloc[-1]['dir']).name}: {steps} steps) trained on "
                      "other data or steps; not drawn.")
    m = _metrics_or_none(fft.iloc[-1]["dir"])
    return m, f" FFT dashed black: main run {Path(fft.iloc[-1]['dir']).name}." if m is not None else ""


def fig_route_study(results: Path | Sequence[Path], out: Path, study: str) -> list[Path]:
    """Paper Fig. 8 for one Route study: Task 0 / Task 1 accuracy and answer routing, a line per setting."""
    df = route_study_table(results, study)
    paths = _save_all(draw_route_study(results, study, df), out)
    if not paths:
        return []
    stem = BIO_STUDIES.get(study, f"fig8_route_{study}")
    return paths + write_table(df.drop(columns="dir"), out, f"table_{stem}")


def draw_route_study(results: Path | Sequence[Path], study: str, table: pd.DataFrame | None = None) -> Drawn:
    """Paper Fig. 8 for one Route study (`table`: its route_study_table, when already built)."""
    df = route_study_table(results, study) if table is None else table
    if df.empty:
        return
    runs = [(row, _metrics_or_none(Path(row["dir"]))) for _, row in df.iterrows()]
    runs = [(row, m) for row, m in runs if m is not None]
    if not runs:
        return
    # panel (c): routing at the answer position; runs older than those records show routing over all tokens
    answers = any(_answer_preserve(m, t) is not None for _, m in runs for t, _, _ in TASKS)
    route = _answer_preserve if answers else (lambda m, task: _route_series(m, task, "preserve"))
    routed = any(route(m, t) is not None for _, m in runs for t, _, _ in TASKS)
    ncols = 3 if routed else 2
    fig, axes = plt.subplots(1, ncols, figsize=(4.3 * ncols + 1.8, 3.9), squeeze=False)
    axes = axes[0]
    colors = _colors(len(runs))
    for (row, m), color in zip(runs, colors, strict=True):
        for ax, (task, _, _) in zip(axes, TASKS, strict=False):
            if _has(m, f"{task}/acc"):  # reference runs of other methods in the study's folder: dashed
                ax.plot(m["step"], 100 * m[f"{task}/acc"], color=color, marker=".", ms=2, lw=1.3,
                        ls="-" if row["method"] == "scale-route" else "--", label=row["setting"])
        if routed:
            for task, ls in (("task0", "-"), ("task1", "--")):
                y = route(m, task)
                if y is not None:
                    axes[2].plot(m["step"], 100 * y, color=color, ls=ls, marker=".", ms=2, lw=1.2)
    study_runs = load_runs(results, "bio", study=study)
    routes = study_runs[study_runs["method"] == "scale-route"]
    r0 = (routes if len(routes) else study_runs).iloc[0]["result"]
    fft, fft_note = _fft_reference(results, r0)
    if fft is not None:
        for ax, (task, _, _) in zip(axes, TASKS, strict=False):
            if _has(fft, f"{task}/acc"):
                ax.plot(fft["step"], 100 * fft[f"{task}/acc"], color="black", ls="--", lw=1,
                        label="FFT (main run)")
    prior = r0.get("priors", {}).get("task0_heldout", {}).get("pooled")
    if prior is not None:
        axes[0].axhline(100 * prior, color="grey", ls=":", lw=1, label="Task 0 chance floor")
    axes[0].set_title("(a) Task 0 (held-out) accuracy", fontsize=10)
    axes[1].set_title("(b) Task 1 accuracy", fontsize=10)
    axes[0].set_ylabel("first-token acc. (%)")
    if routed:
        where = "at the answer position" if answers else "(all tokens)"
        axes[2].set_title(f"(c) routed to preserve {where}", fontsize=10)
        axes[2].set_ylabel("answer positions (%)" if answers else "tokens (%)")
        axes[2].plot([], [], color="grey", ls="-", label="Task 0 slice")
        axes[2].plot([], [], color="grey", ls="--", label="Task 1 slice")
    for ax in axes:
        ax.set_ylim(-3, 103)
        ax.set_xlabel("Task 1 step")
        ax.grid(alpha=0.3)
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    swept = {"tau": "the router threshold tau", "router": "what the router compares",
             "vocab": "the embedding/head rows"}.get(study, study)
    fixed = {k: v for k, v in (r0.get("method_options") or {}).items() if k != study}
    if study != "tau" and len({_tau(r) for r in routes["result"]}) > 1:
        fixed.pop("tau", None)  # not one value across the runs: the table has each
    options = "; options " + ", ".join(f"{k}={_fmt_option(v)}" for k, v in fixed.items()) if fixed else ""
    others = sorted({LABELS.get(m, m) for m in study_runs["method"] if m != "scale-route"})
    refs = f" Dashed coloured lines: {', '.join(others)} runs trained like the study's runs." if others else ""
    fig.text(0.5, -0.02, f"SCALE-Route, study '{study}': {swept} varies, one line per run{options}."
             + refs + fft_note + "\n" + _bio_caption(r0), ha="center", va="top", fontsize=8, wrap=True)
    fig.tight_layout()
    yield BIO_STUDIES.get(study, f"fig8_route_{study}"), fig


def fig_route_studies(results: Path | Sequence[Path], out: Path) -> list[Path]:
    """Fig. 8 per biography Route study present (tau, router, vocab, any other bio study), with its table."""
    return [p for study in study_names(results, "bio") for p in fig_route_study(results, out, study)]


def plot_all(results: Path | Sequence[Path], out: Path) -> list[Path]:
    """Every figure and table the results folders have data for (the one entry point of `scalecl plot`); the
    runs left out for a missing or malformed file are in SKIPPED afterwards."""
    SKIPPED.clear()
    written: list[Path] = []
    written += fig8(results, out)
    for table, stem in ((bio_table(results), "table_bio"), (cpt_table(results), "table_cpt"),
                        (table2(results), "table2_harness")):
        if len(table):
            written += write_table(table, out, stem)
    for fig in (fig9, fig4, fig5, fig6, fig7, fig_route_studies, fig_train_loss, fig_lr_schedule, fig_routing,
                fig_router_score):
        written += fig(results, out)
    return written

"""Results folder -> pandas -> the paper's figures and tables. Pure functions of the results files:
nothing here trains or needs a GPU, so every figure can be rebuilt at any time with `scalecl plot`."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from .errors import ScaleclError  # noqa: E402
from .runs import write_atomic  # noqa: E402

METHOD_ORDER = ("fft", "lora", "freeze", "llama-pro", "scale-preserve", "scale-adapt", "scale-route")
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


def read_result(f: Path) -> dict:
    """A result.json, or one clear error naming the file."""
    try:
        r = json.loads(Path(f).read_text())
        if not isinstance(r, dict) or "experiment" not in r:
            raise ValueError("not a scalecl result (no 'experiment')")
        return r
    except (OSError, ValueError) as e:
        raise ScaleclError(f"unreadable result {f}: {str(e).splitlines()[0][:120]}; remove its run folder or rerun it") from None


def load_runs(results: Path | Sequence[Path], experiment: str, study: str | None = None) -> pd.DataFrame:
    """One row per finished run (result.json) of an experiment; the newest run per (preset, method) kept.

    Study sweeps live under `.../studies/<study>/`: they are left out of the main figures and, with `study=`,
    loaded alone (one row per run, since their options differ). Several results folders may be given.
    """
    rows = []
    for root in _roots(results):
        for f in sorted(root.rglob("result.json")):
            if _study_of(f) != study:
                continue
            r = read_result(f)
            if r.get("experiment") != experiment:
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


def load_metrics(run_dir: Path) -> pd.DataFrame:
    return pd.read_json(Path(run_dir) / "metrics.jsonl", lines=True)


def _save(fig, out: Path, stem: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{stem}.png", out / f"{stem}.pdf"]
    for p in paths:
        fig.savefig(p, dpi=150, bbox_inches="tight")
    plt.close(fig)
    return paths


def _bio_caption(r: dict) -> str:
    d, m, s3 = r["data"], r["config"]["model"], r["config"]["stage3"]
    return (f"preset '{r['preset']}': {d['n_bio']:,} people pre-trained, {d['n_bio'] // 2:,} QA-trained (Task 0), "
            f"{d['n_task1']:,} new (Task 1); GPT-NeoX d={m['hidden']}, {m['layers']} layers; Task 1: "
            f"{s3['steps']} steps x batch {s3['batch']}, FFT lr {s3['lr']:g}. Accuracy on "
            f"{r['config']['eval']['slice_people']}-person slices.")


def fig8(results: Path, out: Path) -> list[Path]:
    """Task 0 / Task 1 first-token accuracy vs Task 1 steps, one panel per method (paper Fig. 8)."""
    runs = load_runs(results, "bio")
    written = []
    for preset, group in runs.groupby("preset", sort=False):
        n = len(group)
        ncols = min(4, n)
        nrows = math.ceil(n / ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 2.9 * nrows + 0.8), squeeze=False,
                                 sharey=True)
        for ax, (_, row) in zip(axes.flat, group.iterrows(), strict=False):
            m = load_metrics(row["dir"])
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
        written += _save(fig, out, f"fig8_bio_{preset}")
    return written


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
            shown[c] = shown[c].map(float_fmt.format)
    paths = [out / f"{stem}.csv", out / f"{stem}.md", out / f"{stem}.tex"]
    write_atomic(paths[0], df.to_csv(index=False))
    write_atomic(paths[1], shown.to_markdown(index=False) + "\n")
    write_atomic(paths[2], shown.to_latex(index=False))
    return paths


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
    written = []
    for preset, group in load_runs(results, "cpt").groupby("preset", sort=False):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for _, row in group.iterrows():
            m = load_metrics(row["dir"])
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
        written += _save(fig, out, f"fig9_cpt_{preset}")
    return written


def fig4(results: Path, out: Path) -> list[Path]:
    """Representation cosine (original channels, step 0 vs now) and forgetting PPL: width vs depth (Fig. 4)."""
    written = []
    wanted = ("scale-preserve", "scale-adapt", "llama-pro")
    names = {"scale-preserve": "Width (Preserve)", "scale-adapt": "Width (Adapt)", "llama-pro": "Depth (LLaMA Pro)"}
    for preset, group in load_runs(results, "cpt").groupby("preset", sort=False):
        group = group[group["method"].isin(wanted)]
        if group.empty:
            continue
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for _, row in group.iterrows():
            m = load_metrics(row["dir"])
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
        written += _save(fig, out, f"fig4_width_vs_depth_{preset}")
    return written


def _study_label(study: str, opts: dict) -> str:
    if study == "init":
        return ",".join(i.upper() if i != "zero" else "0" for i in opts.get("init", ()))
    if study == "l_fp":
        return f"l_fp={opts.get('l_fp')}"
    return "+".join(opts.get("collab", ()))


def study_table(results: Path, study: str) -> pd.DataFrame:
    """One row per study run: its swept option and the end points of forgetting / learning perplexity."""
    rows = []
    for _, row in load_runs(results, "cpt", study=study).iterrows():
        r = row["result"]
        opts = r.get("method_options", {})
        s = r["summary"]
        rows.append({"study": study, "preset": row["preset"], "method": row["method"],
                     "setting": _study_label(study, opts), "l_fp": opts.get("l_fp"),
                     "old_ppl_start": s["old_ppl_start"], "old_ppl_end": s["old_ppl_end"],
                     "new_ppl_start": s["new_ppl_start"], "new_ppl_end": s["new_ppl_end"],
                     "up_norm_end": r["final"].get("up_norm"), "dir": str(row["dir"])})
    df = pd.DataFrame(rows)
    if study == "l_fp" and len(df):
        df = df.sort_values("l_fp")
    return df.reset_index(drop=True)


STUDY_TABLES = {"init": "table_fig5_init", "l_fp": "table_fig6_l_fp", "collab": "table_fig7_collab"}


def _finish_study(fig, results: Path, out: Path, study: str, df: pd.DataFrame, stem: str, note: str = "") -> list[Path]:
    """Caption (method + run settings), save the figure, and write the study's table beside it."""
    r0 = load_runs(results, "cpt", study=study).iloc[0]["result"]
    fig.text(0.5, -0.02, f"{df['method'].iloc[0]}{note}; " + _cpt_caption(r0), ha="center", va="top", fontsize=8,
             wrap=True)
    fig.tight_layout()
    return _save(fig, out, stem) + write_table(df.drop(columns="dir"), out, STUDY_TABLES[study])


def fig5(results: Path, out: Path) -> list[Path]:
    """Forgetting and learning PPL per (W21, W22) initialisation pair (paper Fig. 5)."""
    df = study_table(results, "init")
    if df.empty:
        return []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for _, row in df.iterrows():
        m = load_metrics(row["dir"])
        axes[0].plot(m["step"], m["old/ppl"], marker=".", ms=3, label=row["setting"])
        axes[1].plot(m["step"], m["new/ppl"], marker=".", ms=3, label=row["setting"])
    axes[0].set_title("(a) forgetting PPL (old domain)")
    axes[1].set_title("(b) learning PPL (new domain)")
    for ax in axes:
        ax.set_xlabel("training step")
        ax.set_ylabel("perplexity")
        ax.grid(alpha=0.3)
        ax.legend(title="W21,W22", fontsize=8)
    return _finish_study(fig, results, out, "init", df, "fig5_init_pairs")


def fig6(results: Path, out: Path) -> list[Path]:
    """Forgetting vs learning perplexity as the number of function-preserving layers l_fp varies (Fig. 6)."""
    df = study_table(results, "l_fp")
    if df.empty:
        return []
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
    return _finish_study(fig, results, out, "l_fp", df, "fig6_l_fp")


def fig7(results: Path, out: Path) -> list[Path]:
    """Forgetting PPL against the average upscaled-weight norm, collaborative module attn vs mlp (Fig. 7)."""
    df = study_table(results, "collab")
    if df.empty:
        return []
    fig, ax = plt.subplots(figsize=(6, 4))
    for _, row in df.iterrows():
        m = load_metrics(row["dir"])
        if "up_norm" in m:
            ax.plot(m["up_norm"], m["old/ppl"], marker=".", ms=4, label=f"W12 trains in {row['setting']}")
    ax.set_xlabel("average norm of upscaled weights (W12, W21, W22)")
    ax.set_ylabel("forgetting PPL (old domain)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _finish_study(fig, results, out, "collab", df, "fig7_collab_modules", f", l_fp={df['l_fp'].iloc[0]}")


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
            run = json.loads(f.read_text())
        except (OSError, ValueError):
            raise ScaleclError(f"unreadable harness result {f}; remove it or rerun eval-harness") from None
        if "scores" not in run:
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


def plot_all(results: Path, out: Path) -> list[Path]:
    """Every figure and table that the results folder has data for."""
    written: list[Path] = []
    written += fig8(results, out)
    for table, stem in ((bio_table(results), "table_bio"), (cpt_table(results), "table_cpt"),
                        (table2(results), "table2_harness")):
        if len(table):
            written += write_table(table, out, stem)
    for fig in (fig9, fig4, fig5, fig6, fig7):
        written += fig(results, out)
    return written

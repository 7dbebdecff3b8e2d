"""Results folder -> pandas -> the paper's figures and tables. Pure functions of the results files:
nothing here trains or needs a GPU, so every figure can be rebuilt at any time with `scalecl plot`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from .runs import write_atomic  # noqa: E402

METHOD_ORDER = ("fft", "lora", "freeze", "llama-pro", "scale-preserve", "scale-adapt", "scale-route")
LABELS = {"fft": "FFT", "lora": "LoRA", "freeze": "Freeze", "llama-pro": "LLaMA Pro", "scale-preserve": "SCALE-Preserve",
          "scale-adapt": "SCALE-Adapt", "scale-route": "SCALE-Route"}
# Paper Sec. 5.2 / Fig. 8, quoted for comparison (the paper gives these in prose, not as a table)
PAPER_FIG8 = ("paper (Pythia-160M, 100k people): FFT and LLaMA Pro Task 0 fall to ~15% within 200 steps; "
              "SCALE-Route stays at 100% for 4,000 steps and ends at 36.9%")


def load_runs(results: Path, experiment: str) -> pd.DataFrame:
    """One row per finished run (result.json) of an experiment; the newest run per (preset, method) kept."""
    rows = []
    for f in sorted(Path(results).rglob("result.json")):
        r = json.loads(f.read_text())
        if r.get("experiment") != experiment:
            continue
        rows.append({"dir": f.parent, "preset": r["preset"], "method": r["method"],
                     "date": r.get("provenance", {}).get("date", ""), "result": r})
    if not rows:
        return pd.DataFrame(columns=["dir", "preset", "method", "date", "result"])
    df = pd.DataFrame(rows).sort_values("date").drop_duplicates(["preset", "method"], keep="last")
    df["order"] = df["method"].map({m: i for i, m in enumerate(METHOD_ORDER)}).fillna(len(METHOD_ORDER))
    return df.sort_values(["preset", "order"]).reset_index(drop=True)


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


def plot_all(results: Path, out: Path) -> list[Path]:
    """Every figure and table that the results folder has data for."""
    written: list[Path] = []
    written += fig8(results, out)
    df = bio_table(results)
    if len(df):
        written += write_table(df, out, "table_bio")
    return written

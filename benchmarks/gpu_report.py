"""The GPU check's summary: every target with its measured value and PASS/FAIL, from the files gpu_check.sh wrote.

Reads <out>/bench.json (bench_gpu.py), <out>/bio/*/result.json (the biography `gpu` preset) and
<out>/pytest_gpu.xml; writes <out>/summary.json, <out>/summary.md and <out>/figures/step_times.png, and
prints one line per target. Numbers are only ever read from those files.

    python benchmarks/gpu_report.py --out gpu_check
"""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from pathlib import Path

BIO_BUDGET_S = 25 * 60  # stages 1-2 + FFT, LLaMA Pro and SCALE-Route stage 3 on one H100


def check(name: str, value, op: str, bound, note: str = "") -> dict:
    if value is None:
        verdict = "n/a"
    else:
        verdict = "PASS" if (value <= bound if op == "<=" else value >= bound) else "FAIL"
    return {"target": name, "measured": value, "bound": f"{op} {bound}", "verdict": verdict, "note": note}


def bio_rows(out: Path) -> tuple[list[dict], dict]:
    results = {}
    for f in sorted((out / "bio").glob("*/result.json")):
        r = json.loads(f.read_text())
        results[r["method"]] = r
    if not results:
        return [check("bio gpu preset wall time (s)", None, "<=", BIO_BUDGET_S,
                      "no finished run: see logs/bio-run.log (stopped at --bio-minutes?)")], {}
    any_r = next(iter(results.values()))
    wall = any_r["wall_s"]
    stage3 = sum(r["wall_s"]["stage3"] + r["wall_s"]["stage3_eval"] for r in results.values())
    total = (wall.get("data") or 0) + (wall.get("stage1") or 0) + (wall.get("stage2") or 0) + stage3
    stage1_speed = any_r.get("stage1", {}).get("speed") or {}
    info = {"methods": sorted(results), "wall_s": {"data": wall.get("data"), "stage1": wall.get("stage1"),
                                                    "stage2": wall.get("stage2"), "stage3_all": round(stage3, 1),
                                                    "total": round(total, 1)},
            "stage1_mfu": stage1_speed.get("mfu"), "stage1_tokens_per_s": stage1_speed.get("tokens_per_s"),
            "task0_after_stage2": any_r.get("stage2", {}).get("task0_heldout", {}).get("acc"),
            "summary": {m: r["summary"] for m, r in results.items()}}
    rows = [check("bio gpu preset wall time (s)", round(total, 1), "<=", BIO_BUDGET_S,
                  "data + stages 1-2 + stage 3 of the methods run, evaluation included"),
            check("bio stage 1 MFU (the run itself)", info["stage1_mfu"], ">=", 0.40)]
    fft, route = results.get("fft"), results.get("scale-route")
    if info["task0_after_stage2"] is not None:
        rows.append(check("held-out Task 0 after stage 2 (knowledge extraction)", info["task0_after_stage2"], ">=",
                          0.5, "the phenomenon needs extraction first; chance is ~0.05-0.1"))
    if fft is not None:
        s = fft["summary"]
        rows.append(check("FFT held-out Task 0 min / start (forgetting)", round(s["task0_min"] / max(s["task0_start"],
                                                                                                 1e-9), 3),
                          "<=", 0.5, "FFT must forget"))
    if fft is not None and route is not None:
        rows.append(check("SCALE-Route Task 0 end - FFT Task 0 end", round(route["summary"]["task0_end"]
                                                                           - fft["summary"]["task0_end"], 3),
                          ">=", 0.0, "Route forgets less"))
    return rows, info


def gpu_tests(out: Path) -> dict:
    f = out / "pytest_gpu.xml"
    if not f.exists():
        return {}
    root = ET.parse(f).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    return {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}


def figure(bench: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfgs = {k: v["step_s"] for k, v in bench["configs"].items() if "step_s" in v}
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.barh(list(cfgs), list(cfgs.values()), color="#4c72b0")
    ax.set_xlabel("seconds per training step")
    ax.set_title(f"step times on {bench['peak'].get('device')} ({bench['settings']['batch']} x "
                 f"{bench['settings']['seq']} tokens at Llama-3.2-1B shapes)", fontsize=9)
    ax.invert_yaxis()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    a = ap.parse_args()
    out: Path = a.out
    rows: list[dict] = []
    bench = json.loads((out / "bench.json").read_text()) if (out / "bench.json").exists() else None
    if bench is not None:
        for k, t in bench["targets"].items():
            op, bound = t["target"].split()
            rows.append(check(k, t["measured"], op, float(bound)))
        figure(bench, out / "figures" / "step_times.png")
    bio, info = bio_rows(out)
    rows += bio
    tests = gpu_tests(out)
    if tests:
        rows.insert(0, check("GPU tests failed or errored", tests["failures"] + tests["errors"], "<=", 0,
                             f"{tests['tests']} run, {tests['skipped']} skipped"))
    summary = {"targets": rows, "bio": info, "gpu_tests": tests,
               "bench": {k: bench[k] for k in ("device", "peak", "ratios", "products_faster",
                                              "preservation_max_abs_diff")} if bench else None}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    lines = ["| target | measured | bound | verdict | note |", "|---|---:|---|---|---|"]
    lines += [f"| {r['target']} | {r['measured']} | {r['bound']} | {r['verdict']} | {r['note']} |" for r in rows]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    for r in rows:
        print(f"TARGET {r['target']}: measured {r['measured']} (target {r['bound']}): {r['verdict']}")


if __name__ == "__main__":
    main()

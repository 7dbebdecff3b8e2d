"""The benchmark scripts still run (tiny sizes) and their built-in checks hold; timings are not asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def run(script: str, *args: str, tmp_path: Path) -> dict:
    out = tmp_path / "out.json"
    subprocess.run([sys.executable, str(BENCH / script), *args, "--json", str(out)], check=True,
                   capture_output=True, text=True, cwd=tmp_path)
    return json.loads(out.read_text())


@pytest.mark.slow
def test_bench_scale_runs_and_checks_optimizer_state(tmp_path):
    for arch in ("llama", "gpt_neox"):
        r = run("bench_scale.py", "--arch", arch, "--hidden", "256", "--layers", "2", "--vocab", "128",
                "--hidden-up", "128", "--ffn-up", "64", "--batch", "2", "--seq", "16", "--reps", "1",
                tmp_path=tmp_path)
        assert set(r["median_step_s"]) == {"fft-plain-widened", "preserve", "adapt", "route"}
        for k, n in r["trainable_params"].items():  # AdamW: exp_avg + exp_avg_sq per trainable element
            assert r["optimizer_state_elems"][k] == 2 * n
        assert r["trainable_params"]["route"] == r["trainable_params"]["adapt"] < r["trainable_params"]["fft-plain-widened"]


def test_bench_route_head_forms_agree(tmp_path):
    r = run("bench_route_head.py", "--hidden", "64", "--hidden-up", "16", "--vocab", "512", "--tokens", "32",
            "--reps", "1", tmp_path=tmp_path)
    assert r["max_abs_diff_of_outputs"] < 1e-4
    assert 0.0 < r["tokens_routed_to_preserve"] < 1.0


def test_bench_delta_runs_and_every_delta_loads_to_its_full_checkpoint(tmp_path):
    r = run("bench_delta.py", "--real", "tiny", "--repeats", "1", tmp_path=tmp_path)
    methods = {"freeze", "llama-pro", "scale-preserve", "scale-adapt", "scale-route"}
    for rows in (r["paper_llama_3_2_1b"], r["real"]["rows"]):
        assert {x["method"] for x in rows} == methods
        assert all(0 < x["delta_bytes"] < x["full_bytes"] for x in rows)
    assert all(x["delta_equals_full"] for x in r["real"]["rows"])
    paper = {x["method"]: x for x in r["paper_llama_3_2_1b"]}
    assert paper["scale-route"]["full_bytes"] > 4 * 1_235_814_400  # more than Llama-3.2-1B's own float32 weights


def test_bench_import_threads_sees_the_default_only_when_scalecl_comes_first(tmp_path):
    """In a fresh process, importing scalecl before torch sets OMP_WAIT_POLICY=PASSIVE; torch first is warned and
    keeps libgomp's default; SCALECL_CPU_DEFAULTS=0 sets nothing and warns nothing."""
    out = tmp_path / "out.json"
    subprocess.run([sys.executable, str(BENCH / "bench_import_threads.py"), "--compete", "none", "--rounds", "1",
                    "--hidden", "64", "--layers", "2", "--steps", "1", "--out", str(out)], check=True,
                   capture_output=True, text=True, cwd=tmp_path)
    seen = {r["order"]: (r["omp_wait_policy"], r["warned"]) for r in json.loads(out.read_text())["results"]}
    assert seen == {"scalecl-first": ("PASSIVE", False), "torch-first": (None, True), "opt-out": (None, False)}


def test_bench_estimate_reads_the_estimate_line_and_times_the_command(tmp_path):
    sys.path.insert(0, str(BENCH))
    try:
        from bench_estimate import estimate_seconds
    finally:
        sys.path.remove(str(BENCH))
    assert estimate_seconds("estimate: peak memory ~5.8 GiB ...; time ~32 min (rough: FLOPs / ...)") == 32 * 60
    assert estimate_seconds("...; time ~45 s (rough") == 45 and estimate_seconds("...; time unknown") is None
    out = tmp_path / "out.json"
    subprocess.run([sys.executable, str(BENCH / "bench_estimate.py"), "command", "--out", str(out), "--",
                    "train-cpt", "--preset", "tiny", "--method", "fft"], check=True, capture_output=True, text=True,
                   cwd=tmp_path)
    r = json.loads(out.read_text())
    assert r["rc"] == 0 and r["estimate_line"].startswith("estimate: ") and r["wall_s"] > 0
    assert r["runs_wall_s"] and r["runs_wall_s"][0]["total"] > 0  # the run's own recorded phases


def test_bench_ops_counts_a_qa_steps_operations(tmp_path):
    """bench_ops.py at toy sizes: each model's operations counted (top-level aten calls of one forward and
    backward), SCALE-Route issuing more than FFT (two paths, block products), the ratio written."""
    r = run("bench_ops.py", "--tiny", tmp_path=tmp_path)
    fft, route = r["models"]["fft"], r["models"]["scale-route"]
    assert fft["ops"] > 100 and route["ops"] > fft["ops"] and sum(fft["most"].values()) <= fft["ops"]
    assert r["route_over_fft"] == round(route["ops"] / fft["ops"], 3) and r["provenance"]["commit"]

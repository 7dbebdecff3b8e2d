"""What the GPU check runs on: versions, the GPU, and every package the suite asks for that is missing or older.

Reads pyproject.toml's dependencies (and the optional fused losses), compares them with what this Python imports
(carried wheels first, where gpu_check.sh put them on PYTHONPATH), writes <out> (JSON) and prints one line per
problem. Exits non-zero only when a package the check itself needs is missing (the rest is listed).

    python benchmarks/gpu_env.py --out gpu_check/env.json
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import importlib.util
import json
import platform
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# what the check imports: the tests, the benchmarks, train-bio and train-cpt with builtin data, the report
NEEDED = ["torch", "transformers", "peft", "accelerate", "safetensors", "tokenizers", "typer", "rich", "numpy",
          "matplotlib", "pandas", "pytest", "filelock", "psutil", "scipy", "tabulate"]
OPTIONAL = {"liger-kernel": "compute.loss=liger", "cut-cross-entropy": "compute.loss=cce",
            "triton": "torch.compile's GPU kernels"}


def requirements() -> list[str]:
    """pyproject.toml's dependencies, as written."""
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]


def check(req: str) -> dict:
    """{"requirement", "installed", "ok"} for one requirement string."""
    from packaging.requirements import Requirement

    r = Requirement(req)
    try:
        have = md.version(r.name)
    except md.PackageNotFoundError:
        return {"requirement": req, "installed": None, "ok": False}
    return {"requirement": req, "installed": have, "ok": r.specifier.contains(have, prereleases=True)}


def gpu() -> dict:
    import torch

    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info |= {"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1), "count": torch.cuda.device_count(),
                 "capability": f"{p.major}.{p.minor}"}
    return info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    a = ap.parse_args()
    deps = [check(r) for r in requirements()]
    optional = {}
    for name, use in OPTIONAL.items():
        try:
            optional[name] = {"installed": md.version(name), "for": use}
        except md.PackageNotFoundError:
            optional[name] = {"installed": None, "for": use}
    missing = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    env = {"python": platform.python_version(), "executable": sys.executable, "gpu": gpu(), "dependencies": deps,
           "not_met": [d["requirement"] + f" (installed: {d['installed']})" for d in deps if not d["ok"]],
           "optional": optional, "missing_for_the_check": missing,
           "carried_wheels_first": [p for p in sys.path if p.endswith("/site")]}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(env, indent=2) + "\n")
    print(f"python {env['python']}, torch {env['gpu']['torch']} (CUDA {env['gpu']['cuda']}), GPU: "
          f"{env['gpu'].get('name', 'none')}")
    for line in env["not_met"]:
        print(f"requirement not met: {line}")
    for name, o in optional.items():
        if o["installed"] is None:
            print(f"optional, not installed: {name} ({o['for']})")
    if missing:
        print(f"missing for the check: {', '.join(missing)} (carry them as wheels: benchmarks/gpu_wheels.sh)")
    sys.exit(1 if missing else 0)


if __name__ == "__main__":
    main()

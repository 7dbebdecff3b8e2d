#!/usr/bin/env bash
# Wheels for a GPU machine that cannot reach PyPI (run HERE, where pip works; the GPU check installs them there).
#
#   bash benchmarks/gpu_wheels.sh                       # the optional fused losses, and datasets (train-cpt's corpora)
#   bash benchmarks/gpu_wheels.sh transformers filelock # also these, at constraints.txt's versions
#
# Downloads pure-Python or manylinux x86-64 wheels for CPython 3.12 (the GPU image's Python) into .whl/ (ignored by
# git), without their dependencies: name every missing one (benchmarks/gpu_env.py lists them). A device call must
# then carry .whl; benchmarks/gpu_check.sh installs every wheel in it into its work folder and puts that first on
# PYTHONPATH, so a carried transformers replaces an older one on the machine.
# Mind the size: what travels is at most 64 MiB with the repository (which is ~55 MB); transformers alone is 13 MB.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
mkdir -p .whl
PY="${PYTHON:-python3}"
names=(liger-kernel cut-cross-entropy datasets dill multiprocess "$@")  # datasets: its two the GPU image lacks
specs=()
for n in "${names[@]}"; do
  pin=$(grep -i -E "^${n//-/[-_]}==" constraints.txt | head -1 || true)  # the version the suite is tested with
  specs+=("${pin:-$n}")
done
"$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${specs[@]}"
du -ch .whl/*.whl | tail -1
echo "carry .whl in the device call; gpu_check.sh installs it first on PYTHONPATH"

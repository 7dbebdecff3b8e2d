"""The examples run end to end: each one asserts its own numerical checks, so a broken library fails here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_widen_and_train(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
           "HF_MODULES_CACHE": str(tmp_path / "hf_modules")}  # remote code is copied here, not into ~/.cache
    res = subprocess.run([sys.executable, "examples/widen_and_train.py"], cwd=ROOT, env=env, capture_output=True,
                         text=True, stdin=subprocess.DEVNULL, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "logits equal the base's" in res.stdout
    assert "OK: function preserved, frozen weights untouched, checkpoint round trip exact" in res.stdout


def test_trainer_save_reload(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "hf_modules")}
    res = subprocess.run([sys.executable, "examples/trainer_save_reload.py"], cwd=ROOT, env=env, capture_output=True,
                         text=True, stdin=subprocess.DEVNULL, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "reloaded with trust_remote_code (ScaleLlamaForCausalLM) and with scalecl.load_model" in res.stdout
    assert "OK: trained in Trainer, saved with Trainer.save_model, reloaded exactly" in res.stdout

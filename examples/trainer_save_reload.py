"""Train a SCALE-widened model inside a plain `transformers.Trainer`, save it the transformers way, reload it.

A widened model is a transformers model: `Trainer` trains it as it is (only the new weights require grad), and
`Trainer.save_model` (like `save_pretrained` and `push_to_hub`) writes a folder with SCALE's model code beside
the weights. What it checks (each an assert, so a broken library stops the script):
  1. training moved the new weights and left every frozen tensor bit-identical;
  2. `AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)` and `scalecl.load_model(dir)` both give
     the trained model's logits exactly;
  3. a delta checkpoint (`scalecl.save_model(..., delta=True)`: only what trained, plus the base's identity) is
     smaller and loads from its base to the same logits.

Run it from the repository root (CPU, seconds): python examples/trainer_save_reload.py
"""

import tempfile
from pathlib import Path

import torch
import transformers
from datasets import Dataset
from transformers import AutoModelForCausalLM, LlamaConfig, Trainer, TrainingArguments

from scalecl import ScaleConfig, load_model, save_model, upscale

torch.manual_seed(0)
torch.set_num_threads(1)  # tiny matrices: one thread is fastest
transformers.logging.disable_progress_bar()
transformers.logging.set_verbosity_error()

# a tiny random Llama (no download), widened by 2 heads and 32 FFN channels; upscale() copies, the base stays
config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, max_position_embeddings=64)  # head_dim 16
base = AutoModelForCausalLM.from_config(config).eval()
model = upscale(base, ScaleConfig(variant="adapt", hidden_up=32, ffn_up=32))
ids = torch.randint(0, config.vocab_size, (16, 32))  # (B, T): 16 random sequences
data = Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()})
before = {n: p.detach().clone() for n, p in model.named_parameters()}

with tempfile.TemporaryDirectory() as tmp:
    # 1. a plain Trainer: it builds AdamW over what requires grad, as any other model
    args = TrainingArguments(output_dir=f"{tmp}/trainer", max_steps=8, per_device_train_batch_size=4,
                             learning_rate=1e-2, report_to=[], save_strategy="no", logging_strategy="no",
                             disable_tqdm=True, use_cpu=True)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    model.eval()
    moved = [n for n, p in model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
    assert moved and all(torch.equal(p, before[n]) for n, p in model.named_parameters() if not p.requires_grad)
    print(f"Trainer: {len(moved)} new tensors trained; every frozen tensor bit-identical")

    # 2. Trainer.save_model writes weights, config.json (auto_map) and SCALE's model code
    trainer.save_model(f"{tmp}/wide")
    print("saved:", ", ".join(sorted(p.name for p in Path(f"{tmp}/wide").iterdir() if not p.name.endswith(".bin"))))
    with torch.no_grad():
        logits = model(ids[:4]).logits  # (4, T, V)
        reloaded = AutoModelForCausalLM.from_pretrained(f"{tmp}/wide", trust_remote_code=True).eval()
        torch.testing.assert_close(reloaded(ids[:4]).logits, logits, atol=0, rtol=0)
        torch.testing.assert_close(load_model(f"{tmp}/wide")(ids[:4]).logits, logits, atol=0, rtol=0)
    print(f"reloaded with trust_remote_code ({type(reloaded).__name__}) and with scalecl.load_model: logits identical")

    # 3. only what trained: the base goes to a folder, the delta records it and a digest of its weights
    base.save_pretrained(f"{tmp}/base")
    delta = save_model(model, f"{tmp}/delta", base_model=f"{tmp}/base", delta=True)
    full = save_model(model, f"{tmp}/full")
    size = {p.name: sum(f.stat().st_size for f in p.glob("*.safetensors")) for p in (delta, full)}
    with torch.no_grad():
        torch.testing.assert_close(load_model(delta)(ids[:4]).logits, logits, atol=0, rtol=0)
    print(f"delta checkpoint: {size['delta']:,} bytes of weights against {size['full']:,} for the full one; "
          f"loads from its base to the same logits")
print("OK: trained in Trainer, saved with Trainer.save_model, reloaded exactly")

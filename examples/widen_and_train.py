"""Widen a tiny Llama with SCALE-Route, train it a few steps, save it, and reload it with plain transformers.

What it checks (each an assert, so a broken library stops the script):
  1. at initialisation the widened model computes exactly the base model's function (equal logits);
  2. training moves only the new weights: every frozen tensor is bit-identical afterwards;
  3. the checkpoint reloads with `AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)`, no
     scalecl needed, and gives the trained model's logits.

Run it from the repository root (CPU, a few seconds): python examples/widen_and_train.py
"""

import tempfile

import torch
import transformers
from transformers import AutoModelForCausalLM, LlamaConfig

from scalecl import ScaleConfig, save_model, upscale

torch.manual_seed(0)
torch.set_num_threads(1)  # tiny matrices: one thread is fastest
transformers.logging.disable_progress_bar()  # keep the output to our own lines

# 1. a tiny random base model (no download) and a fixed batch of random tokens
config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, max_position_embeddings=64)  # head_dim 16
base = AutoModelForCausalLM.from_config(config).eval()
ids = torch.randint(0, config.vocab_size, (4, 32))  # (B, T)

# 2. widen: +32 hidden channels (2 new heads) and +32 FFN channels; upscale() copies, so `base` stays intact
model = upscale(base, ScaleConfig(variant="route", hidden_up=32, ffn_up=32)).eval()
with torch.no_grad():
    base_logits = base(ids).logits  # (B, T, V)
    torch.testing.assert_close(model(ids).logits, base_logits, atol=1e-5, rtol=0)  # fp32, CPU
print(f"widened hidden {config.hidden_size} -> {model.config.hidden_size}; logits equal the base's (atol 1e-5)")

# 3. train only what requires_grad (new rows/columns, new norms, the top layer's W12) to fit the batch;
#    frozen: every original tensor, plus the lower layer's W12 held at zero (its original channels stay the base's)
trainable = [p for p in model.parameters() if p.requires_grad]
frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
n_train, n_all = sum(p.numel() for p in trainable), sum(p.numel() for p in model.parameters())
print(f"trainable {n_train:,} of {n_all:,} parameters; {len(frozen)} tensors frozen")
opt = torch.optim.AdamW(trainable, lr=1e-2)
model.train()
losses = []
for _ in range(10):
    loss = model(ids, labels=ids).loss  # next-token cross-entropy (transformers shifts labels)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    losses.append(loss.item())
model.eval()
assert losses[-1] < losses[0], losses
assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)
print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} in {len(losses)} steps; frozen tensors bit-identical")

# 4. save (weights + config + SCALE's model code), reload with transformers alone, compare logits
with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
    path = save_model(model, f"{tmp}/scale-route")
    reloaded = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()
    torch.testing.assert_close(reloaded(ids).logits, model(ids).logits, atol=0, rtol=0)
    print(f"saved and reloaded with trust_remote_code ({type(reloaded).__name__}): logits identical")
print("OK: function preserved, frozen weights untouched, checkpoint round trip exact")

"""Several processes: DDP replicas or FSDP2 shards, and what a sharded model needs to save, resume and evaluate.

`prepare` turns the model a run trains into the module `train` steps: activation checkpointing and
torch.compile first (they act on the decoder blocks), then, under torchrun, DistributedDataParallel
(compute.parallel = "ddp") or PyTorch FSDP2 (`fully_shard`, compute.parallel = "fsdp").

FSDP2 shards every decoder block on its own, then the root (embedding, final norm, head, so that tied
tensors, such as Llama's embedding and head or SCALE's shared new columns, live in one group). Frozen and
trainable parameters mix freely inside a block; SCALE's custom autograd function and Route's fork hook see
ordinary (unsharded) tensors during each block's forward and backward. Training keeps bf16 autocast, as
under DDP, so that both compute the same numbers.

What a sharded model changes elsewhere:
- **Saving.** Checkpoints and the final model are full models (`scalecl.load_model` reads them whatever
  wrote them): every process takes part in gathering the full state dict, which only rank 0 receives (on
  the CPU) and loads into a host copy of the model it kept before sharding; that copy is what it saves.
- **Optimizer state.** Saved as the full, name-keyed state dict (`get_optimizer_state_dict` with
  full_state_dict and cpu_offload), which scalecl.training.state stores as safetensors + JSON; on resume each process
  loads it and keeps its shard (`set_optimizer_state_dict`). A single-process or DDP checkpoint (keyed by
  position) resumes under FSDP too, and the other way round.
- **Evaluation.** Every forward all-gathers each block's parameters, so every process must run the same
  number of forwards: evaluations run on every process, and sharded evaluation pads the processes that got
  fewer batches with a dummy forward (`lockstep_padding`).
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scalecl.compute.perf import (
    compile_failure,
    compile_mode,
    compile_model,
    enable_activation_checkpointing,
    ensure_sdpa,
    hf_model,
)


def is_fsdp(model: nn.Module) -> bool:
    """Whether `model` is the root of an FSDP2-sharded model."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return False
    return isinstance(model, FSDPModule)


def is_ddp(model: nn.Module) -> bool:
    return isinstance(model, nn.parallel.DistributedDataParallel)


def prepare(model: nn.Module, cc, device: torch.device, world: int, steps: int | None = None) -> nn.Module:
    """Activation checkpointing, SDPA, compile, then DDP or FSDP2 (with several processes): the module to step.

    Under FSDP the model is sharded in place and returned itself; under DDP the wrapper is returned and
    `model` stays the plain module (evaluation and saving use it).
    """
    if cc.activation_checkpointing:
        enable_activation_checkpointing(model)
    ensure_sdpa(model)
    compile_model(model, compile_mode(cc.compile, device, steps))  # steps: what compute.compile=auto weighs
    if world <= 1:
        return model
    if cc.parallel == "fsdp":
        shard(model, device)
        return model
    return nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def shard(model: nn.Module, device: torch.device) -> None:
    """FSDP2: one group per decoder block, then the root (everything else, tied tensors together)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from scalecl.models.build import decoder_layers

    # The head of a SCALE model returns a view of its custom function's output, which FSDP2 warns about in
    # case the caller modifies it in place; the loss and evaluation only read logits.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in decoder_layers(hf_model(model)):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def reshard(model: nn.Module) -> None:
    """Put every FSDP group back to its sharded parameters.

    A forward without backward (evaluation) leaves the root group unsharded: its modules then hold the
    gathered tensors instead of the sharded parameters the optimizer steps, and a state dict taken then
    would name the wrong tensors. Evaluation and saving call this after their forwards.
    """
    if not is_fsdp(model):
        return
    from torch.distributed.fsdp import FSDPModule

    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def host_copy(model: nn.Module) -> nn.Module:
    """A CPU copy of the (not yet sharded) model, kept by rank 0 to save full checkpoints from."""
    return copy.deepcopy(model).cpu()


def gather(model: nn.Module, host: nn.Module | None) -> nn.Module | None:
    """The full model to save: `model` itself unless it is sharded; then (every process calls this) each
    parameter is gathered in turn and copied into rank 0's host copy, which is returned (None elsewhere).

    One full tensor at a time, never a full state dict: rank 0 already holds the host copy, and a second full
    copy of the model beside it and its shard did not fit (Llama-3.2-1B's shapes on a 24 GB machine)."""
    if not is_fsdp(model):
        return model
    from torch.distributed.tensor import DTensor

    reshard(model)
    loaded: set[int] = set()
    for name, p in model.named_parameters():  # the same order on every process: full_tensor() is collective
        full = p.full_tensor() if isinstance(p, DTensor) else p.detach()
        if host is not None:
            try:
                target = _tensor(host, name)
            except AttributeError:
                raise RuntimeError(f"gathered state does not fit the host copy: unexpected {name}") from None
            with torch.no_grad():
                target.copy_(full.to(target.device))
            loaded.add(id(target))
        del full
    if host is None:
        return None
    with torch.no_grad():  # buffers are not sharded: every process holds them whole
        for name, b in model.named_buffers():
            try:
                target = _tensor(host, name)
            except AttributeError:
                raise RuntimeError(f"gathered state does not fit the host copy: unexpected {name}") from None
            target.copy_(b.to(target.device))
    untied = [k for k, t in host.named_parameters() if id(t) not in loaded]  # a tied alias is its twin's tensor
    if untied:
        raise RuntimeError(f"gathered state does not fit the host copy: missing {untied[:3]}")
    return host


def _tensor(model: nn.Module, name: str) -> Any:
    mod, _, attr = name.rpartition(".")
    return getattr(model.get_submodule(mod) if mod else model, attr)


def optimizer_state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer state to checkpoint: `opt.state_dict()`, or under FSDP the full name-keyed state dict
    gathered to rank 0's CPU (every process calls this; the others get an empty dict)."""
    if not is_fsdp(model):
        return opt.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    reshard(model)
    return get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def _named(state: dict[str, Any]) -> bool:
    groups = state.get("param_groups", [])
    return any(isinstance(p, str) for g in groups for p in g.get("params", []))


def _by_name(model: nn.Module, opt: torch.optim.Optimizer, state: dict[str, Any]) -> dict[str, Any]:
    """A position-keyed optimizer state (opt.state_dict()) keyed by parameter names instead."""
    names = {id(p): n for n, p in model.named_parameters()}
    order = [names[id(p)] for g in opt.param_groups for p in g["params"]]
    return {"state": {order[i]: s for i, s in state["state"].items()},
            "param_groups": [dict(g, params=[order[i] for i in g["params"]]) for g in state["param_groups"]]}


def _by_position(model: nn.Module, opt: torch.optim.Optimizer, state: dict[str, Any]) -> dict[str, Any]:
    """A name-keyed optimizer state (FSDP's) keyed by position in `opt` instead (opt.load_state_dict's form)."""
    names = {id(p): n for n, p in model.named_parameters()}
    index = {names[id(p)]: i for i, p in enumerate(p for g in opt.param_groups for p in g["params"])}
    return {"state": {index[n]: s for n, s in state["state"].items()},
            "param_groups": [dict(g, params=[index[n] for n in g["params"]]) for g in state["param_groups"]]}


def load_optimizer_state(model: nn.Module, opt: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Resume an optimizer from either form of saved state, sharded or not (every process calls this)."""
    module = model.module if is_ddp(model) else model
    if not is_fsdp(model):
        opt.load_state_dict(_by_position(module, opt, state) if _named(state) else state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    if not _named(state):
        state = _by_name(module, opt, state)
    set_optimizer_state_dict(module, opt, optim_state_dict=state, options=StateDictOptions(full_state_dict=True))


def local(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor for a DTensor (e.g. FSDP's gradient norm, replicated on every process)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def lockstep_padding(model: nn.Module, mine: int, counts: list[int]) -> int:
    """Dummy forwards this process must add so that every process runs max(counts) forwards (FSDP only)."""
    return max(counts) - mine if is_fsdp(model) else 0


def _compiled(model: nn.Module) -> str:
    """How the run was compiled: "model", "graphs", "blocks", "off", or "eager (...)" when compiling failed."""
    failed = compile_failure(model)
    return f"eager ({failed})" if failed else getattr(model, "_scalecl_compile", "off")


def describe(cc, world: int, model: nn.Module) -> dict[str, Any]:
    """How the run was spread over processes, for result.json."""
    mode = "fsdp" if is_fsdp(model) else "ddp" if world > 1 else "single"
    return {"mode": mode, "processes": world, "asked": cc.parallel,
            "activation_checkpointing": bool(cc.activation_checkpointing), "compile": _compiled(model),
            "attention": getattr(hf_model(model).config, "_attn_implementation", None)}

"""The optimizer settings, declared once: AdamW with a learning-rate schedule.

`AdamWConfig` holds the settings every training stage shares; the experiments' config sections (a
biography stage, continual pre-training) extend it with their own steps and batch, so their keys stay
flat (`stage1.beta2`, `train.clip`). `OptimConfig` is what one run's optimizer is built from: those
settings plus the run's learning rate and warm-up in steps (scalecl.training.loop.make_optimizer).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from scalecl.common.schema import opt

SCHEDULES = ("constant", "cosine", "linear")


@dataclass
class AdamWConfig:
    """AdamW (decoupled weight decay on matrices only) and the shape of its learning-rate schedule."""

    schedule: str = opt("constant", choices=SCHEDULES)  # constant | cosine (to min_lr_ratio x lr) | linear (to 0)
    min_lr_ratio: float = opt(0.1, ge=0.0, le=1.0)  # cosine: the rate decays to min_lr_ratio x lr
    weight_decay: float = opt(0.0, ge=0.0)
    beta1: float = opt(0.9, ge=0.0, lt=1.0)
    beta2: float = opt(0.999, ge=0.0, lt=1.0)
    eps: float = opt(1e-8, gt=0.0)
    clip: float = opt(1.0, ge=0.0)  # gradient-norm clipping; 0 = none


@dataclass(kw_only=True)
class OptimConfig(AdamWConfig):
    """One run's optimizer: AdamW settings, its peak learning rate and its warm-up steps."""

    lr: float = field(metadata={"gt": 0.0})  # required
    warmup_steps: int = opt(0, ge=0)

    @classmethod
    def of(cls, settings: AdamWConfig, lr: float, warmup_steps: int = 0) -> OptimConfig:
        """The optimizer of a run configured by `settings` (any section extending AdamWConfig)."""
        shared = {f.name: getattr(settings, f.name) for f in fields(AdamWConfig)}
        return cls(lr=lr, warmup_steps=warmup_steps, **shared)

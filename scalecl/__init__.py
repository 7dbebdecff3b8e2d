"""scalecl: width-upscaled continual learning of LLMs (SCALE, arXiv 2511.03270), baselines and benchmarks.

The public names below load on first use (module __getattr__), so `import scalecl` and the `scalecl` command's
--help do not import torch and transformers: `from scalecl import upscale` works as before. Importing the
package sets the same CPU thread defaults as the `scalecl` command (OMP_WAIT_POLICY=PASSIVE, before torch loads).
"""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import TYPE_CHECKING, Any

from scalecl.common.environment import apply_cpu_defaults
from scalecl.common.errors import ScaleclError
from scalecl.version import __version__

# the CPU thread defaults of the `scalecl` command, for scripts too: set before torch loads (OpenMP reads them
# once), else one warning with the one-line fix (scalecl.common.environment.apply_cpu_defaults)
_note = apply_cpu_defaults(torch_loaded="torch" in sys.modules)
if _note is not None:
    warnings.warn(_note, stacklevel=2)

# public name -> the module that defines it
_LAZY = {
    "load_model": "scalecl.training.checkpoint", "save_model": "scalecl.training.checkpoint",
    "get_method": "scalecl.methods", "method_names": "scalecl.methods",
    "ScaleConfig": "scalecl.methods.scale", "routing_fractions": "scalecl.modeling.scale_surgery",
    "scale_path": "scalecl.modeling.scale_surgery", "upscale": "scalecl.methods.scale.upscale",
}

__all__ = [
    "ScaleConfig", "ScaleclError", "get_method", "load_model", "method_names", "routing_fractions",
    "save_model", "scale_path", "upscale", "__version__",
]

if TYPE_CHECKING:
    from scalecl.methods import get_method, method_names
    from scalecl.methods.scale import ScaleConfig
    from scalecl.methods.scale.upscale import upscale
    from scalecl.modeling.scale_surgery import routing_fractions, scale_path
    from scalecl.training.checkpoint import load_model, save_model


def __getattr__(name: str) -> Any:
    """Import a public name's module when the name is first used (PEP 562)."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

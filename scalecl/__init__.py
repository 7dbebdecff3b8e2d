"""scalecl: width-upscaled continual learning of LLMs (SCALE, arXiv 2511.03270), baselines and benchmarks."""

from .checkpoint import load_model, save_model
from .errors import ScaleclError
from .methods import get_method, method_names
from .methods.scale import ScaleConfig, routing_fractions, scale_path, upscale
from .version import __version__

__all__ = [
    "ScaleConfig", "ScaleclError", "get_method", "load_model", "method_names", "routing_fractions",
    "save_model", "scale_path", "upscale", "__version__",
]

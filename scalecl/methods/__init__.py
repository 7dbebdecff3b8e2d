"""Methods behind one interface; importing this package registers all of them."""

from . import fft, freeze, llama_pro, lora, scale  # noqa: F401  (registration side effects)
from .base import REGISTRY, Method, count_parameters, get_method, method_names, trainable_parameters

__all__ = ["REGISTRY", "Method", "count_parameters", "get_method", "method_names", "trainable_parameters"]

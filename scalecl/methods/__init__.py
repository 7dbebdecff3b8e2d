"""Methods behind one interface; importing this package registers all of them."""

from scalecl.methods import fft, freeze, llama_pro, lora, scale  # noqa: F401  (registration side effects)
from scalecl.methods.base import (
    METHOD_ORDER,
    REGISTRY,
    Method,
    count_parameters,
    get_method,
    method_names,
    option_groups,
    options_class,
    trainable_parameters,
)

__all__ = ["METHOD_ORDER", "REGISTRY", "Method", "count_parameters", "get_method", "method_names", "option_groups",
           "options_class", "trainable_parameters"]

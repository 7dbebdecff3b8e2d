"""The widened layers now live in `scalecl.modeling.scale_layers` (standalone, shipped in checkpoints).

Re-exported here so that the historical import path keeps working; the classes are the same objects.
"""

from scalecl.modeling.scale_layers import (  # noqa: F401
    HeadSplitNorm,
    PathState,
    SplitNorm,
    UpEmbedding,
    UpHead,
    UpLinear,
    _BlockLinear,
    _init_block,
    _same_norm,
)

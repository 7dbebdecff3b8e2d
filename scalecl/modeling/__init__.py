"""SCALE's model code for transformers: standalone (torch + transformers only, nothing from scalecl).

These files are what `scalecl.save_model` copies verbatim into every SCALE checkpoint, next to a config.json
whose `auto_map` names `modeling_scale`, so that `AutoModelForCausalLM.from_pretrained(dir,
trust_remote_code=True)` rebuilds the widened model in a process that never imported scalecl. scalecl
itself imports the same files (`scalecl.methods.scale`): there is one copy of the layer code.
Relative imports between them (`from .scale_layers import ...`) are followed by transformers'
dynamic-module loader, which copies every file they name.
"""

# every file a checkpoint needs, in the order they import each other (tests check it is the closure of the
# relative imports of modeling_scale.py)
REMOTE_CODE_FILES = ("modeling_scale.py", "scale_surgery.py", "scale_spec.py", "scale_layers.py", "scale_arch.py")

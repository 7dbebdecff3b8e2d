"""The package's shape, measured from its source: imports run downward only, and functions stay small.

The layers below are the architecture the code is written to (docs/architecture.md). Every import of a
scalecl module from another must point to a strictly lower layer, or stay inside one subpackage of the
same layer (e.g. methods.scale -> methods.base); the graph must have no circle. No module imports another
module's underscore name: what modules share is public. Functions stay under 80 lines and 8 parameters, except
typer commands (one parameter per flag) and torch.autograd.Function's forward/backward, whose signatures torch
dictates (one tensor per argument).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "scalecl"

# lowest first; a module's layer is that of the longest prefix listed
LAYERS = [
    ["common", "version", "presets", "modeling"],
    ["data"],
    ["models"],
    ["compute", "methods"],
    ["training"],
    ["evaluation"],
    ["report"],
    ["experiments"],
    ["cli"],
    [""],  # the package itself (its public names): nothing inside imports it
]
MAX_LINES, MAX_PARAMS = 80, 8


def _modules() -> dict[str, Path]:
    mods = {}
    for p in ROOT.rglob("*.py"):
        parts = p.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = p
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The scalecl modules `name` imports (anywhere in the file, lazily or not), relative to the package."""
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".") if pkg else []
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            elif (node.module or "").split(".")[0] == "scalecl":
                mod = node.module.removeprefix("scalecl").lstrip(".")
            else:
                continue
            named = {f"{mod}.{a.name}".lstrip(".") for a in node.names} & set(mods)
            out |= named or {mod}
        elif isinstance(node, ast.Import):
            out |= {a.name.removeprefix("scalecl").lstrip(".") for a in node.names if a.name.split(".")[0] == "scalecl"}
    resolved = set()
    for m in out:
        while m not in mods and m:
            m = m.rpartition(".")[0]
        resolved.add(m)
    return resolved - {name}


def _layer(name: str) -> int:
    best, rank = -1, None
    for i, layer in enumerate(LAYERS):
        for prefix in layer:
            if (name == prefix or name.startswith(prefix + ".") or prefix == "") and len(prefix) > best:
                best, rank = len(prefix), i
    return rank


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path, mods) for name, path in mods.items()}


def test_every_module_has_a_layer():
    assert [m for m in _modules() if _layer(m) is None or (m and _layer(m) == len(LAYERS) - 1)] == []


def test_imports_run_downward():
    upward = []
    for name, deps in _graph().items():
        for dep in deps:
            same_package = name.split(".")[0] == dep.split(".")[0] and "." in name + dep
            if _layer(dep) > _layer(name) or (_layer(dep) == _layer(name) and not same_package):
                upward.append(f"{name} -> {dep}")
    assert sorted(upward) == []


def test_no_import_circle():
    graph = _graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append(" -> ".join(path[path.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, path + [dep])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_no_private_imports():
    """`from a.b import _x` couples a module to another's internals: a name two modules share is public."""
    private = []
    for name, path in sorted(_modules().items()):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                source = "." * node.level + (node.module or "")
                private += [f"{name}:{node.lineno} from {source} import {a.name}" for a in node.names
                            if a.name.startswith("_") and not a.name.startswith("__")]
    assert not private, "underscore names imported from another module:\n" + "\n".join(private)


# the one method the code may single out by name: FFT, the reference run every other method is compared with
REFERENCE_METHOD = "fft"


def _names_a_method(node: ast.AST, methods: set[str]) -> bool:
    """Whether `node` compares a value with a method's name (`== "lora"`, `in ("fft", "freeze")`) or a SCALE
    prefix (`.startswith("scale-")`)."""
    if isinstance(node, ast.Compare):
        consts = [c for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
        return any(c.value in methods for c in consts)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "startswith":
        return any(isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value.startswith("scale")
                   for a in node.args for c in ast.walk(a))
    return False


def test_no_branch_on_a_method_name_outside_methods():
    """Training, model loading, the experiments and the CLI ask a method (its layout, shape, options group,
    numerics and hooks) instead of comparing its name; FFT, the reference run, is the one name they may test."""
    from scalecl.methods import method_names

    methods = set(method_names()) - {REFERENCE_METHOD}
    found = []
    for name, path in sorted(_modules().items()):
        if name.split(".")[0] not in ("training", "models", "experiments", "cli"):
            continue
        found += [f"{name}:{node.lineno} {ast.unparse(node)}" for node in ast.walk(ast.parse(path.read_text()))
                  if _names_a_method(node, methods)]
    assert not found, "method names compared outside methods/:\n" + "\n".join(found)


def _exempt(fn: ast.FunctionDef, parents: list[ast.AST]) -> bool:
    typer_command = any(isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "command"
                        for d in fn.decorator_list)
    in_autograd = any(isinstance(p, ast.ClassDef) and any("Function" in ast.unparse(b) for b in p.bases)
                      for p in parents)
    return typer_command or (in_autograd and fn.name in ("forward", "backward"))


def _walk(node: ast.AST, parents: list[ast.AST], where: str):
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) and not _exempt(child, parents):
            yield f"{where}:{child.lineno} {child.name}", child
        yield from _walk(child, parents + [child], where)


def _functions():
    for path in sorted(ROOT.rglob("*.py")):
        yield from _walk(ast.parse(path.read_text()), [], str(path.relative_to(ROOT.parent)))


@pytest.mark.parametrize("limit", ["lines", "parameters"])
def test_functions_stay_small(limit):
    big = []
    for where, fn in _functions():
        a = fn.args
        params = [x for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
        lines = fn.end_lineno - fn.lineno + 1
        if limit == "lines" and lines > MAX_LINES:
            big.append(f"{where}: {lines} lines")
        if limit == "parameters" and len(params) > MAX_PARAMS:
            big.append(f"{where}: {len(params)} parameters")
    assert big == []

"""The figures and tables plot_all makes: each family registers its outputs with @figure / @table.

An output is called as fn(plot, spec) once per experiment whose ReportSpec lists its name in `outputs`, or,
registered with each_experiment=False, once as fn(plot). Either returns the paths it wrote."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scalecl.report.spec import ReportSpec


@dataclass(frozen=True)
class Output:
    """A registered figure or table: its name, what it is, the function making it."""

    name: str
    kind: str
    make: Callable
    each_experiment: bool


_OUTPUTS: dict[str, Output] = {}  # filled once, as the family modules are imported


def output(name: str, kind: str, each_experiment: bool = True) -> Callable[[Callable], Callable]:
    """Register the decorated function as output `name` (a second registration of a name raises)."""

    def register(fn: Callable) -> Callable:
        if name in _OUTPUTS:
            raise ValueError(f"report output {name!r} is registered twice ({_OUTPUTS[name].make.__qualname__} and "
                             f"{fn.__qualname__})")
        _OUTPUTS[name] = Output(name, kind, fn, each_experiment)
        return fn

    return register


def figure(name: str, each_experiment: bool = True) -> Callable[[Callable], Callable]:
    """Register a figure (it may write a table beside it)."""
    return output(name, "figure", each_experiment)


def table(name: str, each_experiment: bool = True) -> Callable[[Callable], Callable]:
    """Register a table."""
    return output(name, "table", each_experiment)


def outputs(order: Sequence[str] = ()) -> list[Output]:
    """The registered outputs: those named in `order` first, in that order, then the others as registered."""
    unknown = [name for name in order if name not in _OUTPUTS]
    if unknown:
        raise ValueError(f"no report output registered as {', '.join(map(repr, unknown))}")
    rest = [o for name, o in _OUTPUTS.items() if name not in order]
    return [_OUTPUTS[name] for name in order] + rest


def check_specs(specs: Sequence[ReportSpec]) -> None:
    """The experiments' names differ (they name the files), and every output a spec lists is registered and
    made per experiment: else one error naming the first problem."""
    names = [spec.name for spec in specs]
    if len(set(names)) < len(names):
        raise ValueError(f"two report specs share an experiment name: {', '.join(names)}")
    for spec in specs:
        for name in spec.outputs:
            o = _OUTPUTS.get(name)
            if o is None or not o.each_experiment:
                raise ValueError(f"experiment {spec.name!r} lists report output {name!r}, which is "
                                 f"{'not registered' if o is None else 'made once for all experiments'}")

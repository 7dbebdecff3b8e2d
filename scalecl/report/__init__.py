"""Results folders -> pandas -> the paper's figures and tables. Pure functions of the results files:
nothing here trains or needs a GPU, so every figure can be rebuilt at any time with `scalecl plot`.

The figure families (bio, cpt, studies, route_studies, routing, training_logs, frontier, mechanism, harness,
tables) register their outputs (scalecl.report.registry); plot_all makes every registered output for the
experiments it is given, each described by a ReportSpec (scalecl.experiments.reports has the suite's)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before any module of the package imports pyplot

from scalecl.common.files import OwnedFiles  # noqa: E402
from scalecl.common.locks import locked  # noqa: E402
from scalecl.report import registry  # noqa: E402
from scalecl.report.bio import draw_fig8, fig8  # noqa: E402
from scalecl.report.context import WRITER, Plot, PlotResult  # noqa: E402
from scalecl.report.cpt import draw_fig4, draw_fig9, fig4, fig9  # noqa: E402
from scalecl.report.draw import mean_curve, pool_replicates  # noqa: E402
from scalecl.report.ensemble import draw_ensemble, fig_ensemble  # noqa: E402
from scalecl.report.frontier import draw_frontier, fig_frontier, frontier_runs, frontier_table  # noqa: E402
from scalecl.report.harness import table2  # noqa: E402
from scalecl.report.heldout import heldout_table, heldout_tables  # noqa: E402
from scalecl.report.mechanism import (  # noqa: E402
    draw_route_mechanism,
    fig_route_mechanism,
    route_mechanism_cpt,
    route_runs,
    table_route_mechanism_cpt,
)
from scalecl.report.route_studies import (  # noqa: E402
    draw_route_study,
    fig_route_studies,
    fig_route_study,
    route_study_table,
)
from scalecl.report.routing import draw_router_score, draw_routing, fig_router_score, fig_routing  # noqa: E402
from scalecl.report.runs import (  # noqa: E402
    LABELS,
    find_files,
    group_label,
    inputs_text,
    load_metrics,
    load_runs,
    load_train_log,
    read_result,
    replicate_groups,
    seeds_of,
    study_names,
)
from scalecl.report.settings import l_fp_text  # noqa: E402
from scalecl.report.spec import FrontierSpec, ReportSpec  # noqa: E402
from scalecl.report.studies import draw_fig5, draw_fig6, draw_fig7, fig5, fig6, fig7, study_table  # noqa: E402
from scalecl.report.table2 import table2_frames, table2_paper  # noqa: E402
from scalecl.report.tables import (  # noqa: E402
    NO_INTERVAL,
    aggregate_table,
    paired_table,
    shown_aggregate,
    study_means,
    summary_table,
    write_study_means,
    write_table,
)
from scalecl.report.training_logs import (  # noqa: E402
    draw_lr_schedule,
    draw_train_loss,
    fig_lr_schedule,
    fig_train_loss,
)

__all__ = [
    "LABELS", "NO_INTERVAL", "RUN_ORDER", "FrontierSpec", "Plot", "PlotResult", "ReportSpec", "aggregate_table",
    "draw_fig4", "draw_fig5", "draw_fig6", "draw_fig7", "draw_fig8", "draw_fig9", "draw_frontier",
    "draw_ensemble", "draw_lr_schedule", "draw_route_mechanism", "draw_route_study", "draw_router_score", "draw_routing",
    "draw_train_loss", "fig4", "fig5", "fig6", "fig7", "fig8", "fig9", "fig_ensemble", "fig_frontier", "fig_lr_schedule",
    "fig_route_mechanism", "fig_route_studies", "fig_route_study", "fig_router_score", "fig_routing",
    "fig_train_loss", "find_files", "frontier_runs", "heldout_table", "heldout_tables", "frontier_table", "group_label", "inputs_text", "l_fp_text",
    "load_metrics", "load_runs", "load_train_log", "mean_curve", "paired_table", "plot_all", "pool_replicates",
    "read_result", "replicate_groups", "route_mechanism_cpt", "route_runs", "route_study_table", "seeds_of",
    "shown_aggregate", "study_means", "study_names", "study_table", "summary_table", "table2",
    "table2_frames", "table2_paper", "table_route_mechanism_cpt", "write_study_means", "write_table",
]

# the order plot_all makes the registered outputs in (each for every experiment listing it, in the order the
# experiments are given); an output registered but not named here comes after these
RUN_ORDER = ("fig8", "summary", "heldout", "table2", "table2_paper", "fig9", "fig4", "fig5", "fig6", "fig7",
             "route_studies", "ensemble", "train_loss", "lr_schedule", "routing", "router_score", "frontier",
             "route_mechanism", "route_mechanism_table")


def plot_all(results: Path | Sequence[Path], out: Path, specs: Sequence[ReportSpec],
             unverified: bool = False, formats: Sequence[str] | None = None, dpi: int | None = None) -> PlotResult:
    """Every figure and table the results folders have data for, for the experiments `specs` describe (the one
    entry point of `scalecl plot`). Nothing is written until every output has been checked; then plot's own
    earlier outputs that these results no longer give are removed (none when nothing was written). Results
    their run folder's manifest does not prove are skipped, or with `unverified` drawn and marked so. Figures are
    saved in `formats` at `dpi` (None: draw.FIGURE_FORMATS, draw.FIGURE_DPI)."""
    registry.check_specs(specs)
    out = Path(out)
    with locked(out, wait=False, what=f"plot folder {out}"):  # one writer of the folder and its manifest
        plot = Plot.of(results, out, unverified=unverified, formats=formats, dpi=dpi)
        plot.files = OwnedFiles(out, WRITER, deferred=True)
        for o in registry.outputs(RUN_ORDER):
            if not o.each_experiment:
                o.make(plot)
                continue
            for spec in specs:
                if o.name in spec.outputs:
                    o.make(plot, spec)
        written = plot.files.flush()  # every name was checked as it was drawn, and is again before the first write
        removed = plot.files.prune({p.name for p in written}) if written else []
    return PlotResult(written, [out / name for name in removed], dict(plot.skipped))

"""What the report needs to know about an experiment, given to it as data: report code reads these fields and
never compares experiment names. The instances live with the experiments (scalecl.experiments.reports)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# (column, result.json dotted path, questions behind one value (a binomial SE) or None)
Metric = tuple[str, str, Callable[[dict], int | None] | None]
# (metrics.jsonl prefix, label, colour) of one evaluation set
EvalSet = tuple[str, str, str]


@dataclass(frozen=True)
class FrontierSpec:
    """The learning-forgetting frontier: x what was learned, y what was kept, each (column, result.json path,
    axis label); values drawn times `scale`; `log`: log axes with error bars cut at 1 (perplexity), else cut at
    0 and 1 (accuracy); `fmt` the table cells; `thresholds`: Task 0 when Task 1 first reaches each (from
    task0/acc and task1/acc); `note` the table's caption, `better` the figure's (which corner is better);
    `whole`, `whole_text`, `part_text`: values measured on whole held-out sets, preferred where a run has them."""

    x: tuple[str, str, str]
    y: tuple[str, str, str]
    scale: float
    log: bool
    fmt: str
    thresholds: tuple[float, ...]
    note: str
    better: str
    # where a run also measured x and y on larger sets than its evaluation slices (CPT: the whole held-out sets,
    # result.json heldout): whole(result) gives its x and y there by column, which the frontier draws and tables
    # instead, in a panel of its own titled `whole_text` (the slice values' panel `part_text`); None: no such sets
    whole: Callable[[dict], dict[str, float] | None] | None = None
    whole_text: str = ""
    part_text: str = ""


@dataclass(frozen=True)
class ReportSpec:
    """One experiment as the report sees it.

    name: its result.json "experiment" (and the tag in file names: table_<name>, frontier_<name>, ...);
    outputs: the registered outputs drawn for it (scalecl.report.registry);
    required: dotted result.json keys a run must have (else it is skipped);
    metrics, table_note: the columns of table_<name> (means over replicates) and its caption's note;
    paired, paired_note: the (column, result.json path) pairs of paired_<name> and its caption's note;
    caption: the line under a figure saying what the run trained on;
    step_label, train_log_note: the step axis, and what a training log is of (caption);
    eval_sets: the evaluation sets of the metrics (routing shares, answer positions);
    answer_positions: whether runs record routing at the scored answer position;
    routing_what, routing_answers_what: the routing figure's caption (the second when answers are drawn);
    study_label(study, method options): a study run's label, for studies other than the Route studies;
    study_variant(result): what a study's runs differ in besides the swept value (a panel each), or None;
    fields: the type of each further result.json key its captions and labels read (dotted path -> type; the
    paths above are numbers unless declared here), checked before a run is used;
    not_named: the config keys its run names leave out (its ExperimentBase.not_named), left out of replicate
    groups too: runs that differ only there (and in their seeds) are replicates of one setting;
    named_when_set: config keys added after runs were made, with the default that behaves as before them (its
    ExperimentBase.named_when_set): a run holding the default is a replicate of one made before the key;
    cl(result, metrics frame): the continual-learning metrics the report adds to each result as `cl`;
    evaluation(result): how the run was evaluated, in words (rows of figures when a preset's runs differ there).
    """

    name: str
    outputs: tuple[str, ...]
    required: tuple[str, ...]
    metrics: tuple[Metric, ...]
    table_note: str
    paired: tuple[tuple[str, str], ...]
    paired_note: str
    frontier: FrontierSpec
    caption: Callable[[dict], str]
    step_label: str
    train_log_note: str
    eval_sets: tuple[EvalSet, ...]
    answer_positions: bool
    routing_what: str
    routing_answers_what: str
    study_label: Callable[[str, dict], str]
    study_variant: Callable[[dict], str] | None = None
    fields: Mapping[str, type | tuple[type, ...]] = field(default_factory=dict)
    not_named: tuple[str, ...] = ()
    named_when_set: Mapping[str, Any] = field(default_factory=dict)
    # the experiment's continual-learning metrics of a run from its result and metrics.jsonl frame (or None):
    # added to every result the report reads as `cl` (scalecl.report.continual)
    cl: Callable[[dict, Any], dict] | None = None
    # how a run was evaluated, in words: figures draw runs of one preset evaluated differently (another slice
    # schedule, a final evaluation on the whole held-out sets) in rows of their own, titled by it; None: one way
    evaluation: Callable[[dict], str] | None = None

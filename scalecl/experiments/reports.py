"""The biography and CPT experiments as `scalecl plot` reports them (scalecl.report.spec.ReportSpec): what a
result must hold, the metrics of their tables and paired comparisons, their frontiers, captions and labels,
and which of the registered figures and tables each gets."""

from __future__ import annotations

from scalecl.experiments.bio import BioExperiment
from scalecl.experiments.cpt import CptExperiment
from scalecl.report.bio import TASKS, bio_caption, slice_questions
from scalecl.report.continual import MATCHED_TASK1, bio_metrics, cpt_metrics
from scalecl.report.cpt import CPT_SETS, cpt_caption, cpt_evaluation, embedding_variant
from scalecl.report.heldout import heldout_point
from scalecl.report.settings import option_label
from scalecl.report.spec import FrontierSpec, ReportSpec
from scalecl.report.studies import study_label
from scalecl.training.record import NUMBER

# Keys added after runs were made, at the default that behaves as before them, of either experiment: runs of
# one experiment that share a config section with the other (model.vocab) group the same way in both.
ADDED_LATER = {**BioExperiment.named_when_set, **CptExperiment.named_when_set}

# (column, where in result.json, questions behind one value: for a binomial SE, or None)
BIO_METRICS = (("task0_start", "summary.task0_start", slice_questions),
               ("task0_min", "summary.task0_min", slice_questions),
               ("task0_end", "summary.task0_end", slice_questions),
               ("task1_end", "summary.task1_end", slice_questions),
               ("task0_full_end", "final.task0_heldout.acc", None), ("task1_full_end", "final.task1.acc", None),
               ("task0_prior", "priors.task0_heldout.pooled", None),
               *((c, f"cl.{c}", None) for c in ("bwt", "task0_auc", "task0_from_max", "task0_at_task1")))
CPT_METRICS = (*((c, f"summary.{c}", None) for c in ("old_ppl_start", "old_ppl_end", "old_ppl_max",
                                                     "new_ppl_start", "new_ppl_end", "rep_cos_end")),
               *((c, f"cl.{c}", None) for c in ("old_ppl_rise", "old_ppl_auc", "old_ppl_from_best")))

BIO_TABLE_NOTE = ("task0_full_end, task1_full_end: full-range final accuracy (result.json final.*.acc); task0_start/"
                  "min/end, task1_end: accuracy on the evaluation slices, with SE = sqrt(p(1-p)/q), the binomial "
                  "standard error of one slice evaluation of q questions (slice_people x attributes) at the shown "
                  "value (blank when q is not recorded). Continual-learning metrics: bwt, backward transfer (full-"
                  "range Task 0 at the end minus after stage 2; negative is forgetting); task0_auc, the area under "
                  "the Task 0 slice curve over the steps it spans (its mean over training); task0_from_max, the "
                  "run's highest Task 0 slice value minus its last; task0_at_task1, Task 0 at the first evaluation "
                  f"where Task 1 reaches {MATCHED_TASK1:g} (matched learning; runs that never do are left out).")

BIO_FRONTIER = FrontierSpec(
    x=("task1_full", "final.task1.acc", "Task 1 learned: full-range final accuracy (%)"),
    y=("task0_full", "final.task0_heldout.acc", "Task 0 retained: held-out full-range final accuracy (%)"),
    scale=100.0, log=False, fmt="{:.3f}",
    thresholds=(0.5, 0.8),  # Task 0 accuracy when Task 1 accuracy first reaches these
    note=("task1_full, task0_full: full-range final accuracy (final.task1.acc, final.task0_heldout.acc). "
          "task0_at_task1_<p>: per run, Task 0 (held-out slice, metrics.jsonl task0/acc) at the first "
          "evaluated step where Task 1 (task1/acc) reaches p/100; blank for a run that never does; mean and "
          "t interval over the runs that reached it (`_reached` of `curves` runs with both curves; `_step` their "
          "mean step)."),
    better=("Upper right is better: Task 1 learned while Task 0 is kept. Error bars are cut at 0 and 100%, "
            "the range of an accuracy (the table has the full intervals)."),
)
CPT_FRONTIER = FrontierSpec(
    x=("new_ppl_end", "summary.new_ppl_end", "learning: new-domain perplexity at the end (log scale)"),
    y=("old_ppl_end", "summary.old_ppl_end", "forgetting: old-domain perplexity at the end (log scale)"),
    scale=1.0, log=True, fmt="{:.2f}", thresholds=(),
    note="new_ppl_end, old_ppl_end: learning (new-domain) and forgetting (old-domain) perplexity at the end.",
    better=("Lower left is better: new domain learned (low learning PPL) while the old one is kept (low "
            "forgetting PPL); an interval reaching below 1 is cut at 1, the lowest perplexity."),
    whole=heldout_point,
    whole_text="whole held-out sets at the training length (result.json heldout)",
    part_text="evaluation slices (summary.*_ppl_end)",
)

BIO_REPORT = ReportSpec(
    name="bio",
    outputs=("fig8", "summary", "route_studies", "ensemble", "train_loss", "lr_schedule", "routing", "router_score",
             "frontier", "route_mechanism"),
    required=("summary.task0_start", "summary.task0_min", "summary.task0_end", "summary.task1_end",
              "final.task0_heldout.acc", "final.task1.acc", "priors.task0_heldout.pooled", "config.stage3.steps",
              "config.stage3.batch", "config.stage3.lr", "config.model.hidden", "config.model.layers",
              "config.eval.slice_people", "data.n_bio", "data.n_task1", "trainable_params", "lr"),
    metrics=BIO_METRICS,
    table_note=BIO_TABLE_NOTE,
    paired=(("task0_full_end", "final.task0_heldout.acc"), ("task1_full_end", "final.task1.acc"),
            ("task0_auc", "cl.task0_auc")),
    paired_note=("Metrics: full-range final accuracy (final.task0_heldout.acc, final.task1.acc) and the area "
                 "under the Task 0 slice curve per step (task0_auc, the mean Task 0 over training)."),
    frontier=BIO_FRONTIER,
    caption=bio_caption,
    step_label="Task 1 step",
    train_log_note=" (stage 3, Task 1)",
    eval_sets=TASKS,
    answer_positions=True,
    routing_what=("SCALE-Route: share of the real tokens of the Task 0 (held-out) and Task 1 evaluation slices "
                  "routed to the preserve (solid) or adapt (dashed) path"),
    routing_answers_what=(", and at the scored answer position (the last prompt token, whose output is the "
                          "answer's first token; adapt = 1 - preserve)"),
    study_label=option_label,
    fields={"priors.task0_heldout": dict},
    not_named=BioExperiment.not_named,
    named_when_set=ADDED_LATER,
    cl=bio_metrics,
)

CPT_REPORT = ReportSpec(
    name="cpt",
    outputs=("summary", "heldout", "fig9", "fig4", "fig5", "fig6", "fig7", "train_loss", "lr_schedule", "routing",
             "frontier", "route_mechanism_table"),
    required=("summary.old_ppl_start", "summary.old_ppl_end", "summary.old_ppl_max", "summary.new_ppl_start",
              "summary.new_ppl_end", "summary.rep_cos_end", "final", "config.train", "config.train.steps",
              "config.train.batch", "config.train.seq_len", "trainable_params", "lr"),
    metrics=CPT_METRICS,
    table_note=("Continual-learning metrics in old-domain perplexity: old_ppl_rise, the end minus step 0 (backward "
                "transfer; positive is forgetting); old_ppl_auc, its mean over training (area under the curve per "
                "step); old_ppl_from_best, the last value minus the run's lowest."),
    paired=(("old_ppl_end", "summary.old_ppl_end"), ("new_ppl_end", "summary.new_ppl_end"),
            ("old_ppl_auc", "cl.old_ppl_auc")),
    paired_note=("Metrics: final forgetting (old) and learning (new) perplexity, and the old-domain perplexity "
                 "averaged over training (old_ppl_auc)."),
    frontier=CPT_FRONTIER,
    caption=cpt_caption,
    step_label="training step",
    train_log_note="",
    eval_sets=CPT_SETS,
    answer_positions=False,
    routing_what="SCALE-Route: share of old- and new-domain evaluation tokens routed to each path",
    routing_answers_what="",
    study_label=study_label,
    study_variant=embedding_variant,
    fields={"final": dict, "final.up_norm": NUMBER, "config.train": dict, "config.base": str, "config.data": dict,
            "config.data.path": str, "config.model.tie_embeddings": bool, "method_options.embed_init": str,
            "method_options.init": list, "method_options.collab": list},
    not_named=CptExperiment.not_named,
    named_when_set=ADDED_LATER,
    cl=cpt_metrics,
    evaluation=cpt_evaluation,
)

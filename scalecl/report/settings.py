"""What tells runs apart in a figure or table: a run's setting within a study (the swept value), the studies'
natural order, and the groups of runs each figure is drawn for (main runs per preset, each study alone)."""

from __future__ import annotations

import math

import pandas as pd

from scalecl.report.context import Plot
from scalecl.report.runs import LABELS, group_label, load_runs, marked, study_names
from scalecl.report.spec import ReportSpec

ROUTER_ORDER = ("logit", "centered", "prob")  # the router's forms in the order its study lists them
ENSEMBLE_STUDY = "ensemble"  # the biography's ensemble controls of SCALE-Route (scalecl.report.ensemble)
AVERAGE_TEXT = {"train": "+ base avg. in training", "eval": "+ base avg. when scored"}
# the biography's Route studies and their figures' stems (another study of Route runs: fig8_route_<name>)
ROUTE_STUDIES = {"tau": "fig8_route_tau", "router": "fig8_route_router", "vocab": "fig8_route_vocab"}


def route_tau(r: dict) -> float | None:
    """A Route run's tau (its method option), or None."""
    tau = (r.get("method_options") or {}).get("tau")
    return float(tau) if tau is not None else None


def recorded_vocab_rows(r: dict) -> tuple[int | None, int | None]:
    """(model rows, tokenizer size): result.json's `vocab` if present, else the configured rows (0: none)."""
    v = r.get("vocab") or {}
    configured = r.get("config", {}).get("model", {}).get("vocab")
    return v.get("model") or configured or None, v.get("tokenizer")


def vocab_key(r: dict) -> int | str:
    """The rows of a run's embedding and head: 'tokenizer' when they are the tokenizer's size (also a run that
    records neither, the default), else the model's rows."""
    model, tok = recorded_vocab_rows(r)
    return "tokenizer" if model is None or model == tok else model


def vocab_text(key: int | str, *results: dict) -> str:
    """A vocabulary key as a label: '1,045 vocab rows (tokenizer's size)' or '50,304 vocab rows'. The tokenizer's
    size is that of every result given (each base seed trains its own tokenizer): '1,043-1,045 vocab rows ...'
    when they differ."""
    if key == "tokenizer":
        sizes = sorted({tok for r in results if (tok := recorded_vocab_rows(r)[1])})
        if not sizes:
            return "vocab rows = tokenizer's size"
        span = f"{sizes[0]:,}" if len(sizes) == 1 else f"{sizes[0]:,}-{sizes[-1]:,}"
        return f"{span} vocab rows (tokenizer's size)"
    return f"{key:,} vocab rows"


def option_text(v) -> str:
    """An option value as a caption shows it: lists joined ('attn+mlp'), others as written."""
    return "+".join(map(str, v)) if isinstance(v, list | tuple) else str(v)


def l_fp_text(l_fp, result: dict | None = None) -> str:
    """`l_fp=N` as a caption or legend shows it. None is SCALE's default, resolved when the model is widened
    (ScaleSpec): L for Preserve, L-1 otherwise (only the top layer's W12 trains); said so, with the number
    when the run records its layer count, never `l_fp=None`."""
    if l_fp is not None and not (isinstance(l_fp, float) and math.isnan(l_fp)):
        return f"l_fp={int(l_fp) if isinstance(l_fp, float) else l_fp}"
    result = result or {}
    layers = (result.get("config") or {}).get("model", {}).get("layers")
    if result.get("method") == "scale-preserve":
        rule, n = "L, every layer preserved", layers
    else:
        rule, n = "L-1, only the top layer's W12 trains", layers - 1 if isinstance(layers, int) else None
    return f"l_fp=auto ({rule}{f': {n}' if isinstance(n, int) else ''})"


def setting_label(spec: ReportSpec, study: str | None, r: dict) -> str:
    """A run's label within its group: the method for main runs, the swept value for a study's runs (the Route
    studies' here, the others' as the experiment labels them); marked when drawn unverified."""
    return marked(_setting_of(spec, study, r), r)


def _setting_of(spec: ReportSpec, study: str | None, r: dict) -> str:
    opts = r.get("method_options") or {}
    if study is None:
        return LABELS.get(r["method"], r["method"])
    study = study.split("-", 1)[0]  # <study>-<suffix> (vocab-control: the Adapt control on its own builds) reads as <study>
    if study == ENSEMBLE_STUDY:
        return control_label(r)
    if study in ROUTE_STUDIES and r.get("method") != "scale-route":  # a reference run beside the Route runs
        name = LABELS.get(r["method"], r["method"])
        if study == "vocab":  # its setting is its rows
            return f"{name}, " + _setting_of(spec, study, {**r, "method": "scale-route"})
        model, tok = recorded_vocab_rows(r)  # no tau or router of its own: the rows alone tell its setting
        return name + ("" if model is None or tok is None or model == tok else f", vocab {model:,}")
    if study in ("tau", "router"):
        label = (f"tau={route_tau(r):g}" if route_tau(r) is not None else "tau=?") if study == "tau" else \
            f"router={opts.get('router', 'logit')}"
        model, tok = recorded_vocab_rows(r)  # a sweep repeated on a padded vocabulary (--set model.vocab=50304)
        return label + ("" if model is None or tok is None or model == tok else f", vocab {model:,}")
    if study == "vocab":  # the rows, not the tokenizer's size, which differs between base seeds
        model, tok = recorded_vocab_rows(r)
        return "vocab=tokenizer's size" if model is None or model == tok else f"vocab={model:,} (padded)"
    return spec.study_label(study, opts)


def ensemble_mode(r: dict) -> str:
    """A biography run's ensemble.mode ("none" for runs made before the option)."""
    return ((r.get("config") or {}).get("ensemble") or {}).get("mode", "none")


def rate_text(lr: float) -> str:
    """A learning rate as a label shows it: '1e-4', '3e-4', '1.5e-3'."""
    mantissa, exponent = f"{lr:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def control_label(r: dict) -> str:
    """A run of the ensemble study as its figure and tables name it: the method with the option that tells its
    variant (Route's tau, LoRA's rank, LLaMA Pro's new blocks) and its rate, and how it is averaged with its
    base: 'FFT (1e-4)', 'LoRA (r=34, 1e-3)', 'FFT (3e-4) + base avg. in training'."""
    opts, method, lr = r.get("method_options") or {}, r.get("method"), r.get("lr")
    option = {"scale-route": f"tau={route_tau(r):g}" if route_tau(r) is not None else "", "lora": f"r={opts.get('rank')}",
              "llama-pro": f"n={opts.get('n')}"}.get(method, "")
    parts = [x for x in (option, rate_text(lr) if isinstance(lr, int | float) and not isinstance(lr, bool) else "") if x]
    name = LABELS.get(method, method) + (f" ({', '.join(parts)})" if parts else "")
    mode = ensemble_mode(r)
    return f"{name} {AVERAGE_TEXT[mode]}" if mode in AVERAGE_TEXT else name


def option_label(study: str, opts: dict) -> str:
    """A study run's label as `<option>=<value>`: the study's name is the method option it sweeps."""
    return f"{study}={opts.get(study)}"


def study_setting(spec: ReportSpec, study: str, r: dict) -> str:
    """What tells a study's settings apart (the swept value, plus the experiment's study variant, e.g. a CPT
    run's embedding variant); runs with equal settings differ only in their seeds and are replicates."""
    label, variant = setting_label(spec, study, r), spec.study_variant(r) if spec.study_variant else ""
    return f"{label}; {variant}" if variant else label


def study_sort_key(study: str | None, r: dict) -> tuple:
    """Swept values in their natural order (numbers ascending, the router's forms as the study lists them);
    in a Route study, reference runs of other methods after the Route run of the same value."""
    key = _value_sort_key(study, r)
    return key + (r.get("method") != "scale-route",) if study in ROUTE_STUDIES else key


def _value_sort_key(study: str | None, r: dict) -> tuple:
    opts = r.get("method_options") or {}
    if study == "tau":
        tau = route_tau(r)
        return (recorded_vocab_rows(r)[0] or 0, -math.inf if tau is None else tau)
    if study == "router":
        name = opts.get("router", "logit")
        return (recorded_vocab_rows(r)[0] or 0, ROUTER_ORDER.index(name) if name in ROUTER_ORDER else len(ROUTER_ORDER), name)
    if study == "vocab":
        return (recorded_vocab_rows(r)[0] or 0,)
    if study == "l_fp":
        return (opts.get("l_fp") or 0,)
    return ()


def figure_groups(plot: Plot, spec: ReportSpec) -> list[tuple[str, str | None, pd.DataFrame]]:
    """(file tag, study, runs) per figure: main runs by preset (`bio_cpu`), each study alone (`study_tau`)."""
    out = []
    for preset, group in load_runs(plot, spec).groupby("preset", sort=False):
        out.append((f"{spec.name}_{preset}", None, group))
    for study in study_names(plot, spec):
        runs = load_runs(plot, spec, study=study)
        if len(runs):
            keys = [study_sort_key(study, r) for r in runs["result"]]
            runs = runs.iloc[sorted(range(len(runs)), key=lambda i: keys[i])]
            out.append((f"study_{study}", study, runs))
    return out


def line_label(spec: ReportSpec, study: str | None, g: pd.DataFrame) -> str:
    """A line's label: its replicate group `g` (main runs, naming the units of its mean and band when it has
    several: '3 base seeds', '3 run seeds of base 0') or the study's setting of the run."""
    row = g.iloc[0]
    if study is not None:
        return setting_label(spec, study, row["result"])
    bases = g["base_seed"].nunique()  # the units of tables.replicate_unit: base seeds, else run seeds
    if max(bases, len(g) if bases == 1 else 0) < 2:
        return group_label(row)
    unit = f"{bases} base seeds" if bases > 1 else f"{len(g)} run seeds of base {row['base_seed']}"
    return f"{group_label(row)} ({unit})"

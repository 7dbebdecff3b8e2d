"""compute.compile and the training forward (issue 43, item 3): exact on CPU, and safe when compiling fails.

- "auto" compiles the whole model on CUDA and nothing on a CPU (CPU runs keep their numbers); true is "blocks";
- a model that fails to compile trains eagerly after one printed line: its first step is run again on the same
  micro-batches and random state, so the run's numbers are the eager run's, bit for bit;
- the whole model traced by dynamo (backends that generate no code, fast on CPU) trains the numbers of the eager
  model, with the model's own loss and with the chunked one, SCALE-Route included;
- training forwards build no KV cache (use_cache=False), so a compiled graph does not change between steps.
"""

from __future__ import annotations

import copy
from itertools import repeat

import pytest
import torch

from scalecl import get_method
from scalecl.compute.loss import ModelLoss, step_loss
from scalecl.compute.perf import compile_failure, compile_mode, compile_model, compiled
from scalecl.training.loop import Hooks, OptimConfig, TrainPlan, train
from tests.conftest import make_base, method_cases, random_batch


def test_compile_mode_per_device(monkeypatch):
    AUTO_COMPILE_MIN_STEPS = 2000  # SCALECL_COMPILE_MIN_STEPS's default
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert compile_mode("auto", cpu) == "off" and compile_mode("auto", cuda) == "model"
    assert compile_mode("auto", cuda, steps=AUTO_COMPILE_MIN_STEPS) == "model"  # the gpu preset's stage 1 (3,500)
    assert compile_mode("auto", cuda, steps=AUTO_COMPILE_MIN_STEPS - 1) == "off"  # its stage 3: compiling costs more
    assert compile_mode("auto", cpu, steps=10**6) == "off" and compile_mode("model", cuda, steps=1) == "model"
    monkeypatch.setenv("SCALECL_COMPILE_MIN_STEPS", "350")  # gpu_check.sh's biography run at a tenth of its steps
    assert compile_mode("auto", cuda, steps=350) == "model" and compile_mode("auto", cuda, steps=150) == "off"
    assert compile_mode(True, cpu) == "blocks" and compile_mode(False, cuda) == "off"
    assert compile_mode("model", cpu) == "model" and compile_mode("blocks", cuda) == "blocks"


def _batch(model, seed: int = 1) -> dict[str, torch.Tensor]:
    ids = random_batch(model.config.vocab_size, batch=2, seq=12, seed=seed)
    labels = ids.clone()
    labels[:, :4] = -100
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def _losses(model, steps: int = 3, loss=None, accum: int = 1) -> list[float]:
    torch.manual_seed(0)
    plan = TrainPlan(steps, OptimConfig(lr=1e-2, schedule="constant"), accum=accum, loss=loss)
    return train(model, repeat(_batch(model)), plan, hooks=Hooks())


def _failing_backend(gm, example_inputs):
    raise RuntimeError("forced compile failure (test)")


def test_a_model_that_fails_to_compile_trains_eagerly_with_one_line(capsys):
    eager = make_base("llama-gqa-tied")
    model = copy.deepcopy(eager)
    compile_model(model, "model", backend=_failing_backend)
    assert compiled(model)
    got = _losses(model, accum=2)
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("compute.compile:")]
    assert len(lines) == 1 and "forced compile failure" in lines[0] and "trains eagerly" in lines[0], out
    assert not compiled(model) and "forced compile failure" in compile_failure(model)
    assert got == _losses(eager, accum=2)  # the same micro-batches and random state: the eager numbers, bit for bit
    for a, b in zip(model.parameters(), eager.parameters(), strict=True):
        assert torch.equal(a, b)


def test_an_error_that_is_not_compilings_is_raised():
    model = make_base("neox-parallel")
    compile_model(model, "model", backend="eager")

    with pytest.raises(ValueError, match="not a compile error"):
        train(model, repeat(_batch(model)), TrainPlan(1, OptimConfig(lr=1e-2), loss=_Raising()), hooks=Hooks())
    assert compiled(model)  # not undone: the error was the computation's


class _Raising(ModelLoss):
    def __call__(self, model, batch):
        raise ValueError("not a compile error")


@pytest.mark.parametrize("method, loss_kind", [
    ("fft", "chunked"),  # the CUDA default: the whole model compiled, the chunked loss on its hidden states
    pytest.param("scale-route", "model", marks=pytest.mark.slow),  # SCALE's custom autograd and Route's fork (~80 s)
])
def test_the_whole_model_traced_trains_the_eager_numbers(method, loss_kind):
    """torch.compile of the whole model with dynamo's "aot_eager" backend (graph capture and AOTAutograd, no
    code generation: exact and fast on CPU); inductor's kernels round differently and are checked on a GPU
    (tests/compute/test_gpu.py) and on CPU by tests/compute/test_speed.py (slow)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    opts = method_cases(l_fp=1)[method]
    eager = get_method(method, **opts).apply(make_base("neox-parallel"))
    model = copy.deepcopy(eager)
    compile_model(model, "model", backend="aot_eager")
    cpu = torch.device("cpu")
    got = _losses(model, loss=step_loss(model, loss_kind, cpu))
    assert compile_failure(model) is None
    want = _losses(eager, loss=step_loss(eager, loss_kind, cpu))
    assert got == pytest.approx(want, rel=1e-6, abs=1e-6)
    # SCALE's block products (forward and input gradient) are traced, not broken at every widened linear by
    # products written into column slices (41 graphs for this model before, 12 after: Route's Gram cache, kept
    # out of the graph, is the one break left)
    breaks = torch._dynamo.utils.counters["graph_break"]
    assert not [r for r in breaks if "out=" in r], list(breaks)
    assert all("gram" in r.lower() for r in breaks) if method != "fft" else not breaks, list(breaks)


def test_training_forwards_build_no_kv_cache(monkeypatch):
    import transformers

    made = []
    real = transformers.DynamicCache.__init__

    def counting(self, *a, **k):
        made.append(1)
        real(self, *a, **k)

    monkeypatch.setattr(transformers.DynamicCache, "__init__", counting)
    for loss in ("model", "chunked"):
        model = make_base("llama-gqa-untied")
        _losses(model, steps=2, loss=step_loss(model, loss, torch.device("cpu")))
    assert made == []
    model(_batch(model)["input_ids"])  # a plain forward (generation's) still makes one
    assert made


def test_cuda_graphs_mark_every_step_and_keep_a_copy_of_its_loss(monkeypatch):
    """compute.compile=graphs (mode="reduce-overhead"): a replay overwrites the memory of the last one's outputs,
    which failed on a GPU ("accessing tensor output of CUDAGraphs that has been overwritten") while the loop kept
    each step's loss until the next host read. Every forward is now marked as a new step and its loss copied. On
    CPU the same graph is traced with aot_eager (no CUDA graphs): the numbers are the eager ones."""
    from scalecl.compute.perf import graph_replayed, whole_model_compiled

    torch._dynamo.reset()
    marks = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    eager = make_base("neox-parallel")
    model = copy.deepcopy(eager)
    compile_model(model, "graphs", backend="aot_eager")
    assert graph_replayed(model) and whole_model_compiled(model) and compile_mode("graphs", torch.device("cuda", 0))
    got = _losses(model, steps=3)
    assert len(marks) == 3 and not graph_replayed(eager)
    assert got == pytest.approx(_losses(eager, steps=3), rel=1e-6, abs=1e-6)
    again = copy.deepcopy(eager)
    compile_model(again, "graphs", backend="aot_eager")
    assert _losses(again, steps=2, accum=2) and len(marks) == 3 + 4  # one mark per micro-batch


def test_cuda_graphs_need_cuda():
    from scalecl.common.errors import ScaleclError
    from scalecl.compute.perf import check_compute
    from scalecl.experiments.config import ComputeConfig

    with pytest.raises(ScaleclError, match="compile=graphs .* needs a CUDA device"):
        check_compute(ComputeConfig(compile="graphs"), torch.device("cpu"), 1)

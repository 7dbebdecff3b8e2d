"""What the machine contributes to a run's numbers: the numerics a record was made with against this run's."""

import pytest


def test_a_record_made_with_other_numerics_names_the_setting_that_reproduces_it():
    """check_numerics: a finished run or stage made with other float sums is refused with the fix that matches."""
    from scalecl.common.errors import ScaleclError
    from scalecl.compute.machine import check_numerics

    ours = {"device": "cpu", "cpu_threads": 1}
    bf16 = {"numerics": {"device": "cpu", "cpu_threads": 1, "autocast": "bfloat16"}}
    check_numerics({"numerics": dict(ours)}, ours, "the stage", "--force rebuilds it")  # the same: passes
    with pytest.raises(ScaleclError, match=r"CPU, 1 thread, bf16 autocast.*compute.cpu_bf16=true uses it"):
        check_numerics(bf16, ours, "the stage", "--force rebuilds it")
    with pytest.raises(ScaleclError, match=r"compute.threads=2 uses it"):
        check_numerics({"numerics": {"device": "cpu", "cpu_threads": 2}}, ours, "the stage", "--force rebuilds it")


# ---------------------------------------------------------------------------------------------------------
# The default device on a CUDA machine (issue 43): `cuda` is given its index where it is chosen. On a CPU
# machine torch is told it has two CUDA devices; torch.cuda.set_device's own index check
# (torch._utils._get_device_index, which raises on an index-less `cuda` here too) runs, only the driver call
# that would follow is recorded.


@pytest.fixture
def fake_cuda(monkeypatch):
    import torch

    selected: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_setDevice", selected.append, raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    return selected


def test_the_index_check_refuses_an_index_less_cuda_device(fake_cuda):
    """What crashed `train-bio --preset gpu` without --device: the check the tests below pass through."""
    import torch

    with pytest.raises(ValueError, match="specified index"):
        torch.cuda.set_device(torch.device("cuda"))
    torch.cuda.set_device(torch.device("cuda", 1))
    assert fake_cuda == [1]


def test_the_default_device_is_an_indexed_gpu(fake_cuda, monkeypatch):
    import torch

    from scalecl.common.errors import ScaleclError
    from scalecl.compute.machine import pick_device

    assert pick_device() == torch.device("cuda", 0)
    assert pick_device("cuda") == torch.device("cuda", 0)
    assert pick_device("cuda:1") == torch.device("cuda", 1)
    assert pick_device(None, local_rank=1) == torch.device("cuda", 1)  # one GPU per torchrun process
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert pick_device("cuda") == torch.device("cuda", 1)
    assert pick_device("cpu") == torch.device("cpu")
    with pytest.raises(ScaleclError, match="2 CUDA device"):
        pick_device("cuda:2")
    with pytest.raises(ScaleclError, match="local rank is 3"):
        pick_device(None, local_rank=3)
    for name in (None, "cuda", "cuda:1"):
        torch.cuda.set_device(pick_device(name))  # the real index check passes
    assert fake_cuda == [1, 1, 1]


@pytest.mark.parametrize("given, world, want", [(None, 1, 0), ("cuda", 1, 0), ("cuda:1", 1, 1), (None, 2, 1),
                                                ("cuda", 2, 1)])
def test_the_sweep_enters_an_indexed_gpu_without_device(fake_cuda, tmp_path, given, world, want):
    """The sweep's CUDA branch (check, then enter_device before any data or model) with the real index check:
    `train-bio` / `train-cpt` without --device on a GPU machine, one process or a torchrun process of local
    rank 1."""
    import torch

    from scalecl.compute.processes import Dist
    from scalecl.experiments import load_preset
    from scalecl.experiments.base import Paths
    from scalecl.experiments.bio import BioExperiment
    from scalecl.experiments.cpt import CptExperiment
    from scalecl.experiments.sweep import SweepOptions, check, enter_device

    precision = torch.get_float32_matmul_precision()
    try:
        for exp in (BioExperiment(load_preset("bio", "tiny"), "tiny", Paths(tmp_path / "out")),
                    CptExperiment(load_preset("cpt", "tiny"), "tiny", Paths(tmp_path / "out"))):
            d = Dist(rank=world - 1, world=world, local_rank=world - 1)
            dev, _ = check(exp, ["fft"], SweepOptions(device=given), d)
            assert dev == torch.device("cuda", want)
            assert exp.numerics == {"device": "cuda"}  # runs are named by the device type, as before
            enter_device(dev, exp.rc.compute)
    finally:
        torch.set_float32_matmul_precision(precision)
    assert fake_cuda == [want, want]

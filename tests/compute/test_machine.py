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

"""The suite's pytest-xdist groups take effect (tests/xdist_groups.py): in a worker under `--dist loadgroup`, a
test marked xdist_group carries `@<group>` in its node id, which is what sends a group's tests to one worker."""

from __future__ import annotations

import pytest

from tests.durations import plain_id


@pytest.mark.xdist_group("test_xdist_groups")
def test_a_grouped_test_runs_under_its_group(request):
    config = request.config
    if not (hasattr(config, "workerinput") and config.getvalue("loadgroup")):
        pytest.skip("not in a pytest-xdist worker under --dist loadgroup (-n 0, or another --dist)")
    assert request.node.nodeid.endswith("::test_a_grouped_test_runs_under_its_group@test_xdist_groups")
    assert plain_id(request.node.nodeid) == request.node.nodeid.removesuffix("@test_xdist_groups")


def test_an_ungrouped_test_keeps_its_id(request):
    assert request.node.nodeid.endswith("::test_an_ungrouped_test_keeps_its_id")

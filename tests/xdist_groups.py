"""`--dist loadgroup` as pytest-xdist documents it, also with pytest 9.2 (a pytest plugin loaded by conftest.py).

pytest-xdist 3.8 tells its scheduler a test's group by appending `@<group>` to the test's node id in each worker,
through the private attribute `_nodeid`. pytest 9.2 keeps node ids structured, in `_id`, and no longer reads
`_nodeid`: the suffix is lost and every `xdist_group` mark is silently ignored, so the tests of one group spread
over the workers (upstream: pytest-dev/pytest-xdist issue 1386). In a worker, after pytest-xdist's own hook, this
gives each grouped test the id pytest-xdist meant, unless it already has it. tests/test_xdist_groups.py checks
that a grouped test runs under its group's id."""

from __future__ import annotations

import pytest


def group_of(item: pytest.Item) -> str | None:
    """The group pytest-xdist gives a test: the names of its xdist_group marks, sorted and joined by '_'."""
    names = {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
    return "_".join(sorted(names)) if names else None


@pytest.hookimpl(trylast=True)  # after pytest-xdist's hook, which sets the suffix where pytest still reads it
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not (hasattr(config, "workerinput") and config.getvalue("loadgroup")):
        return
    for item in items:
        group = group_of(item)
        if group is None or item.nodeid.endswith(f"@{group}"):
            continue
        wanted = f"{item.nodeid}@{group}"
        if hasattr(item, "_id"):  # pytest >= 9.2: a structured NodeId
            from _pytest.nodeid import NodeId

            item._id = NodeId.parse(wanted)
        else:
            item._nodeid = wanted
        if item.nodeid != wanted:
            raise pytest.UsageError(f"cannot give {item.nodeid} its xdist group {group!r} (pytest {pytest.__version__})")

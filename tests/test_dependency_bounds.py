"""The lower-bound constraints of `.ci/run --lowest` (docs/testing.md, "Dependency versions").

Every dependency in pyproject.toml must name a lower bound, so that the lowest-versions run pins all of
them; a new dependency added without one fails here, in the default run, not only in that CI job.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _helper():
    spec = importlib.util.spec_from_file_location("lowest_constraints", ROOT / ".ci" / "lowest_constraints.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_dependency_of_pyproject_is_pinned_to_its_lower_bound():
    helper = _helper()
    pyproject = helper.tomllib.loads((ROOT / "pyproject.toml").read_text())   # tomllib, or tomli on 3.10
    project = pyproject["project"]
    runtime_and_test = project["dependencies"] + project["optional-dependencies"]["test"]
    for declared, pins in ((runtime_and_test, helper.constraints(pyproject, ["test"], build=False)),
                           (pyproject["build-system"]["requires"], helper.constraints(pyproject, [], build=True))):
        assert len(pins) == len(declared) > 0
        for requirement, pin in zip(declared, pins):
            name, version = pin.split("==")
            assert requirement.replace(" ", "").startswith(f"{name}>={version}"), (requirement, pin)


def test_a_dependency_without_a_lower_bound_is_refused():
    helper = _helper()
    assert helper.lower_bound("numpy>=1.26") == "numpy==1.26"
    assert helper.lower_bound('tomli[x]>=2.0,<3; python_version < "3.11"') == 'tomli==2.0; python_version < "3.11"'
    for requirement in ("numpy", "numpy<3", "numpy>=1,>=2"):
        with pytest.raises(helper.NoLowerBound, match="lower bound"):
            helper.lower_bound(requirement)

"""Pip constraints that pin every dependency in pyproject.toml to its lower bound.

    python .ci/lowest_constraints.py [--extra test ...] [--build]

prints a constraints file (``name==version`` a line) for ``[project].dependencies`` and the named
optional-dependency groups (default: ``test``), or with ``--build`` for ``[build-system].requires``.
`.ci/run --lowest` installs the project with it, so the suite runs against the oldest release the
project claims to support (docs/testing.md, "Dependency versions").

The bounds are read from pyproject.toml, so there is no second list to keep in step. Each requirement
must have a lower bound (``>=`` or ``==``): one without is an error, because "any version" is a claim
nobody has checked. Environment markers are kept; extras are dropped (constraints cannot name them).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pip carries tomli, the same parser
    from pip._vendor import tomli as tomllib

try:
    from packaging.requirements import Requirement
except ModuleNotFoundError:  # a fresh venv has pip but not packaging; pip carries a copy
    from pip._vendor.packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


class NoLowerBound(ValueError):
    """A requirement in pyproject.toml names no lowest version."""


def lower_bound(requirement: str) -> str:
    """``name==version`` (with the requirement's marker) for `requirement`'s ``>=`` or ``==`` bound."""
    req = Requirement(requirement)
    bounds = [spec.version for spec in req.specifier if spec.operator in (">=", "==")]
    if len(bounds) != 1:
        raise NoLowerBound(f"{requirement!r} in pyproject.toml needs exactly one lower bound (>= or ==); "
                           "give it the oldest release the tests pass with (docs/testing.md)")
    pin = f"{req.name}=={bounds[0]}"
    return f"{pin}; {req.marker}" if req.marker else pin


def constraints(pyproject: dict, extras: list[str], build: bool) -> list[str]:
    """The constraint lines for the runtime dependencies plus `extras`, or for the build requirements."""
    if build:
        requirements = pyproject["build-system"]["requires"]
    else:
        project = pyproject["project"]
        groups = project.get("optional-dependencies", {})
        missing = [extra for extra in extras if extra not in groups]
        if missing:
            raise KeyError(f"no optional-dependencies group {missing} in pyproject.toml")
        requirements = list(project.get("dependencies", []))
        for extra in extras:
            requirements += groups[extra]
    return [lower_bound(requirement) for requirement in requirements]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extra", action="append", help="optional-dependencies group (default: test)")
    parser.add_argument("--build", action="store_true", help="pin [build-system].requires instead")
    parser.add_argument("--pyproject", type=Path, default=PYPROJECT)
    args = parser.parse_args(argv)
    with open(args.pyproject, "rb") as file:
        pyproject = tomllib.load(file)
    try:
        lines = constraints(pyproject, args.extra or ["test"], args.build)
    except (NoLowerBound, KeyError) as exc:
        print(f"lowest_constraints: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

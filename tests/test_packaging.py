"""Packaging: every package of the source tree is installed, under the one top-level package `redfuser`."""
from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAPPED = {"redfuser": "redfuser", "redfuser.ir": "ir", "redfuser.codegen": "codegen", "redfuser.runtime": "runtime"}


def _source_packages() -> set[str]:
    found = set()
    for prefix, folder in MAPPED.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base).parts
            if prefix == "redfuser" and rel and rel[0] in ("ir", "codegen", "runtime"):
                continue
            found.add(".".join((prefix, *rel)))
    return found


def test_every_package_is_listed_in_pyproject():
    text = (ROOT / "pyproject.toml").read_text()   # (no tomllib: Python 3.10 is supported)
    block = re.search(r"^packages = \[(.*?)\]", text, re.S | re.M).group(1)
    listed = set(re.findall(r'"([\w.]+)"', block))
    assert _source_packages() <= listed, sorted(_source_packages() - listed)


def test_subpackages_import_under_redfuser():
    import redfuser.codegen
    import redfuser.ir
    import redfuser.runtime

    assert redfuser.ir.__name__ == "redfuser.ir" and redfuser.codegen.__name__ == "redfuser.codegen"
    assert redfuser.runtime.__name__ == "redfuser.runtime"

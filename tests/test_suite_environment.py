"""The test suite runs with RedFuser's defaults, whatever the caller's environment holds.

`conftest.py` clears the variables of `redfuser.config` that change defaults for a user's own runs
(`helpers.DEFAULT_CHANGING`): with ``REDFUSER_CACHE=0`` left in a shell, the tests of the compile cache failed
(9 of them), and with ``REDFUSER_AUTOTUNE=1`` a test of the cache's second build did. Run this file with
those variables set (``REDFUSER_CACHE=0 REDFUSER_AUTOTUNE=1 REDFUSER_BACKEND=interpret python3 -m pytest
tests/test_suite_environment.py``) to see the clearing at work; the subprocess test below does that.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from redfuser import config

from helpers import DEFAULT_CHANGING


def test_the_suite_sees_the_defaults():
    assert config.cache_enabled()
    assert config.default_backend() == "auto"
    assert not config.autotune_enabled()
    assert config.dump_dir() is None
    assert all(name not in os.environ for name in DEFAULT_CHANGING)


def test_a_callers_settings_do_not_reach_the_suite(tmp_path):
    """The check above, in a pytest run started with every default-changing variable set."""
    env = dict(os.environ, REDFUSER_CACHE="0", REDFUSER_AUTOTUNE="1", REDFUSER_BACKEND="interpret",
               REDFUSER_DUMP_DIR=str(tmp_path / "dumps"))
    here = Path(__file__)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          f"{here}::test_the_suite_sees_the_defaults"],
                         cwd=here.parent.parent, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]


def test_an_unknown_hypothesis_profile_is_a_usage_error_naming_the_variable():
    """(Found by a helper.) ``HYPOTHESIS_PROFILE=long`` ended every run in hypothesis's traceback from
    conftest.py ("Profile 'long' is not registered"), naming neither the variable nor the profiles."""
    here = Path(__file__)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
                          f"{here}::test_the_suite_sees_the_defaults"], cwd=here.parent.parent,
                         env=dict(os.environ, HYPOTHESIS_PROFILE="long"), capture_output=True, text=True, timeout=300)
    assert run.returncode == 4, run.stdout[-2000:] + run.stderr[-2000:]
    assert "HYPOTHESIS_PROFILE='long' is not a profile of this suite: use one of ci, fuzz" in run.stderr
    assert "Traceback" not in run.stderr

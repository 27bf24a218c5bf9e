"""The command line: `python -m redfuser demo`, `explain` and `fuzz`."""
from __future__ import annotations

import subprocess
import sys

import pytest

from redfuser import cli


def test_demo_says_which_backend_ran_and_checks_the_result(capsys):
    assert cli.main(["demo", "--backend", "interpret", "--workload", "softmax"]) == 0
    out = capsys.readouterr().out
    assert "backend: interpret (requested)" in out
    assert "=== stage: traced ===" in out and "=== stage: fused ===" in out
    assert "fused=True" in out and "OK" in out


def test_demo_on_auto_names_why_it_chose_the_backend(capsys):
    assert cli.main(["demo", "--workload", "log_softmax"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("backend: ") and "auto" in first


def test_explain_prints_the_reasoning(capsys):
    assert cli.main(["explain", "--backend", "interpret", "--workload", "mean_abs_deviation"]) == 0
    out = capsys.readouterr().out
    assert "NOT fused" in out and "abs(" in out


def test_user_errors_exit_2_with_the_message(capsys):
    assert cli.main(["demo", "--backend", "no-such-backend"]) == 2
    assert "unknown backend" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["fuzz", "--examples", "3", "--seed", "5"]])
def test_module_entry_point_runs(args):
    done = subprocess.run([sys.executable, "-m", "redfuser", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "failures: 0" in done.stdout

"""The command line: `python -m redfuser demo`, `explain` and `fuzz`."""
from __future__ import annotations

import subprocess
import sys

import pytest

from redfuser import cli
from redfuser.workloads import WORKLOADS


def test_demo_says_which_backend_ran_and_checks_the_result(capsys):
    assert cli.main(["demo", "--backend", "interpret", "--workload", "softmax"]) == 0
    out = capsys.readouterr().out
    assert "backend: interpret (requested)" in out
    assert "=== stage: traced ===" in out and "=== stage: fused ===" in out
    assert "fused=True" in out and "OK" in out


def test_demo_names_only_the_members_that_joined_the_pass_as_fused(capsys):
    """moe_routing's cascade holds its top-k `weights`, which runs after the loop: the demo listed every member
    of the cascade under ``fused=True``; it now says which members were fused and why the others were not."""
    assert cli.main(["demo", "--backend", "interpret", "--workload", "moe_routing"]) == 0
    section = capsys.readouterr().out.split("=== what was fused ===", 1)[1].split("check against", 1)[0]
    lines = section.strip().splitlines()
    assert lines[0] == "m, p_sum: fused=True"
    assert lines[1].startswith("weights: fused=False — `weights` ranks ")
    assert not any("weights" in line.split("fused=True")[0] for line in lines if "fused=True" in line)


def test_demo_on_auto_names_why_it_chose_the_backend(capsys):
    assert cli.main(["demo", "--workload", "log_softmax"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("backend: ") and "auto" in first


def test_explain_prints_the_reasoning(capsys):
    assert cli.main(["explain", "--backend", "interpret", "--workload", "mean_abs_deviation"]) == 0
    out = capsys.readouterr().out
    assert "NOT fused" in out and "abs(" in out


def test_explain_takes_the_workload_as_a_positional_argument_too(capsys):
    """The help lists workloads as a positional argument would be: ``explain softmax`` was a usage error."""
    assert cli.main(["explain", "--backend", "interpret", "log_softmax"]) == 0
    assert capsys.readouterr().out.startswith("kernel log_softmax:")
    with pytest.raises(SystemExit):
        cli.main(["explain", "log_softmax", "--workload", "softmax"])
    assert "two workloads named" in capsys.readouterr().err


def test_user_errors_exit_2_with_the_message(capsys):
    assert cli.main(["demo", "--backend", "no-such-backend"]) == 2
    assert "unknown backend" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["fuzz", "--examples", "3", "--seed", "5", "--backend", "interpret"]])
def test_module_entry_point_runs(args):
    done = subprocess.run([sys.executable, "-m", "redfuser", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "failures: 0" in done.stdout


@pytest.mark.parametrize("args, message", [
    (["--examples", "-5"], "--examples: must be at least 1, got -5"),
    (["--examples", "0"], "--examples: must be at least 1"),
    (["--max-axis", "0"], "--max-axis: must be at least 1, got 0"),
    (["--jobs", "-1"], "--jobs: must be at least 0"),
    (["--backend", "bogus"], "--backend: invalid choice: 'bogus'"),
    (["--examples", "lots"], "'lots' is not a whole number"),
    (["--timeout", "0"], "--timeout: must be positive"),
    (["--out", __file__], "is not a folder reproducers can be written to"),    # (checked before the campaign)
    (["--jobs", "0", "--timeout", "5"], "--timeout needs a worker process to stop"),
    (["--jobs", "0", "--timeout=5"], "--timeout needs a worker process to stop"),
])
def test_fuzz_refuses_bad_values_with_a_usage_error(args, message):
    done = subprocess.run([sys.executable, "-m", "redfuser", "fuzz", *args], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and message in done.stderr and "usage: redfuser fuzz" in done.stderr, done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr


def test_fuzz_refuses_cuda_where_it_cannot_run(capsys, monkeypatch):
    monkeypatch.setattr("redfuser.testing.fuzz.backends_here", lambda: ("interpret", "cpu", "simulate"))
    with pytest.raises(SystemExit) as exit_:
        cli.main(["fuzz", "--backend", "cuda"])
    assert exit_.value.code == 2 and "backend 'cuda' cannot run here" in capsys.readouterr().err


@pytest.mark.parametrize("command, says", [
    ("demo", "Compile, fuse, run and check a workload on the best backend present"),
    ("explain", "Print what the compiler does with a workload, in words"),
])
def test_demo_and_explain_help_say_what_they_do_and_list_the_workloads(capsys, command, says):
    with pytest.raises(SystemExit) as exit_:
        cli.main([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert exit_.value.code == 0 and says in out
    for name in WORKLOADS:
        assert name in out


def test_top_level_help_names_every_command(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "demo" in out and "explain" in out and "fuzz" in out and "workloads:" in out


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_demo_of_every_workload_passes_its_own_check_on_the_cpu(capsys, name):
    """Each workload's demo check holds (a quantized GEMM's is its quantization bound: the int8 demo compared
    the fused GEMM, which rounds with the running absmax, with numpy's rounding and failed)."""
    assert cli.main(["demo", "--workload", name, "--backend", "cpu"]) == 0
    assert "OK" in capsys.readouterr().out


def test_a_user_error_from_the_module_entry_point_names_no_python_internals():
    """``python -m redfuser`` runs through ``<frozen runpy>``: an error's location line must not be that
    frame (no user wrote it)."""
    done = subprocess.run([sys.executable, "-m", "redfuser", "explain", "--workload", "softmax", "--backend", "nope"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "unknown backend 'nope'" in done.stderr, done.stderr
    assert "<frozen" not in done.stderr and "Traceback" not in done.stderr


def test_cache_prints_its_size_and_clears_it(capsys, monkeypatch, tmp_path):
    """The on-disk cache only grows (an entry per specialization, none evicted; found by a helper): ``python -m
    redfuser cache`` says where it is and what it holds, and ``--clear`` deletes its entries."""
    import numpy as np

    import redfuser as rf
    from redfuser.runtime.cache import reset_default_cache

    monkeypatch.setenv("REDFUSER_CACHE_DIR", str(tmp_path))
    reset_default_cache()
    try:
        for n in (3, 5):
            rf.kernel(lambda x: x + 1.0, backend="cpu", dynamic=False)(np.ones(n, np.float32))
        assert cli.main(["cache"]) == 0
        out = capsys.readouterr().out
        assert str(tmp_path) in out and "0 entries" not in out
        assert cli.main(["cache", "--clear"]) == 0
        assert "cleared: 0 entries" in capsys.readouterr().out
        assert not list(tmp_path.glob("*/*.bin"))
    finally:
        reset_default_cache()

"""The benchmark scripts without a GPU: ``gpu_check.py --dry-run`` compiles every case and writes its
table and JSON to ``$OUT``; the budget, speed-up and table logic; ``compile_time.py``'s cache folders;
``static_counts.py``'s table and counters; every script's command line refusing what it cannot run
(counts below 1, unknown ``--only`` names and targets, ``profile_case.py`` without a device).
Where torch (and Triton) are installed, the whole device check runs on the CPU (``--smoke-cpu``) and
the Triton peers compile to PTX without a GPU; elsewhere those two tests skip, naming the package."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import call_overhead  # noqa: E402
import compile_time  # noqa: E402
import cpu_bench  # noqa: E402
import dynamic_shapes  # noqa: E402
import gpu_cases  # noqa: E402
import gpu_check  # noqa: E402
import profile_case  # noqa: E402
import static_counts  # noqa: E402


def test_dry_run_compiles_every_case_and_writes_the_table_to_out(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert gpu_check.main(["--dry-run", "--tiny"]) == 0
    printed = capsys.readouterr().out
    assert "no device" in printed and "compiled for sm_90" in printed
    payload = json.loads((tmp_path / "gpu_check.json").read_text())
    assert payload["mode"] == "dry-run"
    assert (tmp_path / "gpu_check.txt").read_text().strip() == printed.strip()
    rows = payload["rows"]
    for case in gpu_cases.cases("tiny"):
        ours = next(r for r in rows if r["case"] == case.label and r["impl"] == "redfuser")
        assert ours["status"] in ("no device", "FAILED")
        if ours["status"] == "no device":
            assert ours["check"].startswith("PTX for sm_90:")
        else:                                              # a case the GPU backend cannot compile says why
            assert ours["error"]
        variants = [name for name, _ in gpu_check.variants(case)]
        assert [r["impl"] for r in rows if r["case"] == case.label][1:] == variants + list(case.peers)
    assert any(r["impl"] == "redfuser" and "mma.sync" in r["check"] and " 0 mma.sync" not in r["check"]
               for r in rows)                            # attention runs on tensor cores


def test_every_case_names_work_peers_and_inputs():
    full = gpu_cases.cases("full")
    assert {c.workload for c in full} == {"attention", "causal_attention", "softmax", "log_softmax",
                                          "moe_routing", "moe_routing_top8", "fp8_quant_gemm", "gemm",
                                          "flash_attention_f16", "flash_attention_bf16", "gqa_attention_f16",
                                          "rms_norm"}
    # each workload at three shapes or more (numpy's-rules attention is one labelled row; routing at two
    # widths, the serving one (4096 tokens x 256 experts, top-8) among them)
    for name in ("attention", "causal", "decode", "softmax", "log_softmax", "fp8_gemm", "gemm"):
        for workload in {c.workload for c in full if c.name == name}:
            assert len({c.inputs for c in full if c.workload == workload and c.name == name}) >= 3, (name, workload)
    assert any(c.workload == "moe_routing_top8" and c.inputs[0][0] == (4096, 256) for c in full)
    assert {"sdpa", "flex_attention", "triton"} <= set(next(c for c in full if c.name == "causal").peers)
    # grouped-query attention (Llama 3 8B's 32 query heads on 8 key/value heads) against SDPA's own grouping
    gqa = [c for c in full if c.workload == "gqa_attention_f16"]
    assert len({c.inputs for c in gqa}) >= 3 and all(c.inputs[1][0][1] * 4 == c.inputs[0][0][1] for c in gqa)
    assert {"sdpa", "flex_attention"} <= set(gqa[0].peers)
    assert "torch.matmul" in next(c for c in full if c.name == "gemm").peers
    assert {"scaled_mm", "scaled_mm alone"} <= set(next(c for c in full if c.name == "fp8_gemm").peers)
    # SDPA is compared with the bodies users write for f16 and bf16; numpy's-rules attention is its own row
    assert {(c.inputs[0][1], c.workload) for c in full if c.name == "attention"} == {
        ("float16", "flash_attention_f16"), ("bfloat16", "flash_attention_bf16")}
    numpy_rules = next(c for c in full if c.name == "attention_numpy_rules")
    assert numpy_rules.workload == "attention" and numpy_rules.peers == ("sdpa",)
    decode = next(c for c in full if c.name == "decode")
    assert decode.inputs[0][0][2] == 1 and decode.inputs[1][0][2] == 32768 and decode.peak == "hbm"
    # head 256: wgmma tiles in dynamic shared memory on Hopper
    assert {c.inputs[0][0][-1] for c in full if c.name == "attention"} == {64, 128, 256}
    decode = next(c for c in full if c.name == "decode")
    assert {c.inputs[0][1] for c in full if c.name == "attention"} == {"float16", "bfloat16"}
    for c in full:
        assert c.work > 0 and c.peak in gpu_check.UNITS
        assert all(p in ("sdpa", "flex_attention", "torch", "torch.compile", "triton", "scaled_mm", "scaled_mm alone",
                         "torch topk(softmax)", "triton fused routing", "torch.matmul", f"torch.{c.workload}")
                   for p in c.peers)
    causal = next(c for c in full if c.causal)
    plain = next(c for c in full if c.name == "attention" and c.inputs[0][0] == causal.inputs[0][0])
    assert causal.work == plain.work / 2


def test_measure_skips_once_the_budget_is_spent():
    case = gpu_cases.cases("tiny")[0]
    budget = gpu_check.Budget(0.0)
    row = gpu_check.measure("sdpa", lambda *a: pytest.fail("must not run"), case, [], (), None, {}, budget)
    assert (row.status, row.check) == ("skipped", "time budget spent")


def test_speedups_and_the_table():
    rows = [gpu_check.Row("c", "redfuser", ms=2.0, rate=10.0, unit="GB/s", fraction_of_peak=0.5),
            gpu_check.Row("c", "torch", ms=3.0), gpu_check.Row("c", "triton", status="skipped", check="no Triton"),
            gpu_check.Row("d", "redfuser", status="FAILED", error="BackendError: no TopK"),
            gpu_check.Row("d", "torch", ms=1.0)]
    gpu_check.speedups(rows)
    assert rows[1].redfuser_speedup == pytest.approx(1.5)
    assert rows[4].redfuser_speedup is None                 # RedFuser failed there: no ratio
    text = gpu_check.table(rows, ["header"])
    assert "BackendError: no TopK" in text and "no Triton" in text and "1.50" in text and "50.0" in text


def test_compile_time_cache_folders_are_private_and_restored(tmp_path, monkeypatch):
    from redfuser.runtime.cache import default_cache

    monkeypatch.setenv("REDFUSER_CACHE_DIR", str(tmp_path / "mine"))
    with compile_time.CacheFolder(str(tmp_path / "fresh")):
        assert default_cache().directory == tmp_path / "fresh"
    assert default_cache().directory == tmp_path / "mine"


def test_compile_time_rows(monkeypatch):
    case = next(c for c in gpu_cases.cases("tiny") if c.name == "softmax")
    times = compile_time.redfuser_times(case, 1)
    assert set(times) == {"cold", "llvm", "warm", "disk"} and all(t > 0 for t in times.values())
    assert times["llvm"] < times["cold"]                      # LLVM's part lies inside the cold compile
    monkeypatch.setitem(sys.modules, "triton_peers", None)            # as where Triton is not installed
    assert compile_time.triton_times(case, 1)["error"].startswith("Triton is not installed")


def test_compile_times_alternate_and_the_ratio_is_the_median_of_pairs(monkeypatch):
    """RedFuser and Triton compile alternately (a drifting machine slows both alike); the ratio is the
    median of the pairs' ratios; a case without a peer or with a failing one has no ratio."""
    order: list[str] = []
    ours = iter([1.0, 4.0, 2.0])
    theirs = iter([10.0, 10.0, 40.0])
    def redfuser_times(case, n):
        order.append("rf")
        cold = next(ours)
        return {"cold": cold, "llvm": cold / 2, "warm": 0.1, "disk": 0.2}

    monkeypatch.setattr(compile_time, "redfuser_times", redfuser_times)
    monkeypatch.setattr(compile_time, "triton_times",
                        lambda case, n: (order.append("triton"), {"cold": next(theirs), "cubin": 50.0})[1])
    case = next(c for c in gpu_cases.cases("tiny") if c.name == "softmax")
    got, peer, ratio = compile_time.paired_times(case, 3)
    assert order == ["rf", "triton"] * 3
    assert got["cold"] == 2.0 and peer["cold"] == 10.0 and ratio == pytest.approx(0.1)   # pairs: .1 .4 .05
    assert got["llvm_ratio"] == pytest.approx(0.05)                                      # half of each
    moe = next(c for c in gpu_cases.cases("tiny") if c.name == "moe_routing")
    ours = iter([1.0])
    assert compile_time.paired_times(moe, 1)[1:] == ({"error": "no Triton peer"}, None)
    monkeypatch.setattr(compile_time, "triton_times", lambda case, n: {"error": "Triton is not installed"})
    ours = iter([1.0, 1.0])
    assert compile_time.paired_times(case, 2)[1:] == ({"error": "Triton is not installed"}, None)


def test_triton_peers_compile_to_ptx_without_a_gpu(tmp_path):
    pytest.importorskip("triton")
    import triton_peers

    for name, dtype in [("attention", "float16"), ("decode", "bfloat16"), ("log_softmax", "float16")]:
        for spec in triton_peers.kernel_specs(name, dtype, head_d=64, cols=1000):
            result = triton_peers.compile_to_ptx(spec, 90, cache_dir=str(tmp_path / name))
            assert ".target sm_90" in result["ptx_text"] and result["ptx"] > 0


def test_the_device_check_runs_whole_on_the_cpu(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    monkeypatch.setenv("OUT", str(tmp_path))
    assert gpu_check.main(["--smoke-cpu", "--only", "softmax", "moe_routing"]) == 0
    rows = json.loads((tmp_path / "gpu_check.json").read_text())["rows"]
    ours = [r for r in rows if r["impl"] == "redfuser"]
    assert [r["status"] for r in ours] == ["ok", "ok"] and all(r["ms"] > 0 for r in ours)
    variants = {name: "ok" for name, _ in gpu_check.VARIANTS.get("softmax", ())}   # timed beside the default
    assert {r["impl"]: r["status"] for r in rows if r["case"].startswith("softmax")} == {
        "redfuser": "ok", **variants, "torch.softmax": "ok", "torch": "ok", "triton": "skipped",
        "torch.compile": "skipped"}


def test_static_counts_table_has_every_kernel_and_variant(capsys, monkeypatch):
    """A row per kernel of every case (and per `gpu_check.VARIANTS` option with ``--variants``), whose
    counts are the kernel's own: the PTX column is the PTX's instruction count, registers are positive."""
    monkeypatch.setattr(static_counts, "find_cuobjdump", lambda: None)
    assert static_counts.main(["--tiny", "--variants"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["case", "kernel", "llvm", "ptx", "sass", "regs", "spill", "B", "shared", "B", "wgmma"]
    body = [line for line in lines[2:] if line.strip() and not line.startswith("RedFuser")]
    for case in gpu_cases.cases("tiny"):
        assert any(line.startswith(case.label + " ") for line in body), case.label
        for name, _ in gpu_check.variants(case):
            assert any(line.startswith(f"{case.label} {name.removeprefix('redfuser ')}") for line in body)
    attention = next(line for line in body if line.startswith(gpu_cases.cases("tiny")[0].label + " "))
    llvm, ptx, sass, regs, spill, shared, wgmma = attention.split()[-7:]
    assert int(llvm) > int(ptx) / 4 > 0 and sass == "-" and int(regs) > 0 and spill == "0" and wgmma == "0"
    assert 0 < int(shared) <= 48 * 1024          # the default target, sm_90: static shared memory only
    assert "no cuobjdump" in lines[-1]


def test_static_counts_counters():
    ptx = "//\n.visible .entry k()\n{\n\t.reg .b32 %r<3>;\n\tmov.u32 %r1, 1;\n\tadd.s32 %r2, %r1, 1;\n\tret;\n}\n"
    assert static_counts.ptx_instructions(ptx) == 3
    assert static_counts.llvm_instructions('define void @k() {\nentry:\n  %x = add i32 1, 2\n  ret void\n}') == 2
    listing = ("        /*0000*/                   LDC R1, c[0x0][0x28] ;\n"
               "        /*0010*/                   NOP ;\n"
               "        /*0020*/              @!P0 EXIT ;\n")
    assert static_counts.count_sass(listing) == 2


def test_the_fp8_gemm_check_catches_what_the_worst_case_bound_lets_through():
    """The device check's FP8 GEMM test, on the host: inputs made like `gpu_cases.make_inputs` (each
    token's absmax repeated every 16 elements). The numpy body and RedFuser's cpu kernel pass; an output
    scaled by 0.5 or 0.7, a GEMM over three quarters of K and one that never quantizes (each computed with
    numpy from the same inputs) fail, though every one of them is inside the documented worst-case bound."""
    import numpy as np

    import redfuser as rf
    from redfuser.testing.quantization import absmax_in_every_window, spike_rows
    from redfuser.workloads import fp8_quant_gemm

    rng = np.random.default_rng(0)
    m, k, n = 32, 4096, 48
    x = spike_rows(rng.standard_normal((m, k)).astype(np.float32)).astype(np.float16)
    w = rng.standard_normal((k, n)).astype(rf.float8_e4m3fn)
    ws = rng.uniform(0.5, 2.0, n).astype(np.float32)
    assert absmax_in_every_window(x).all()
    ref = gpu_cases.QuantizedReference(x, w, ws)
    body = fp8_quant_gemm(x, w, ws)
    for honest in (body, rf.kernel(fp8_quant_gemm, backend="cpu")(x, w, ws)):
        passed, text = gpu_cases.fp8_check("redfuser", honest, ref)
        assert passed, text
    quarter = k // 4
    planted = {"scaled by 0.5": body * 0.5, "scaled by 0.7": body * 0.7,
               "a quarter of K missing": fp8_quant_gemm(x[:, quarter:], w[quarter:], ws),
               "not quantized": ((x.astype(np.float64) @ w.astype(np.float64)) * ws).astype(np.float32)}
    for name, out in planted.items():
        assert ref.check(out).bound_ratio <= 1.0, name      # what the device check used to accept
        passed, text = gpu_cases.fp8_check("redfuser", out, ref)
        assert not passed, f"{name}: {text}"
    # a peer is held to the quantization's relative error only (it rounds its output to bf16)
    assert gpu_cases.fp8_check("scaled_mm", body.astype(rf.bfloat16).astype(np.float32), ref)[0]
    assert not gpu_cases.fp8_check("scaled_mm", body * 0.7, ref)[0]


ROUTING_CHECK = """
import sys, torch, triton_peers
for rows, experts, k in ((100, 128, 2), (37, 256, 8), (5, 64, 8)):
    x = torch.randn(rows, experts, generator=torch.Generator().manual_seed(rows)) * 3
    weights, got = triton_peers.moe_routing(x, k)
    want, want_experts = torch.topk(torch.softmax(x.double(), -1), k)
    assert torch.equal(got, want_experts), (rows, experts, k)
    assert float((weights.double() - want / want.sum(-1, keepdim=True)).abs().max()) < 1e-6
print("ok")
"""


def test_the_triton_routing_peer_equals_topk_of_softmax():
    """The fused Triton routing peer (`triton_peers.moe_routing`), run by Triton's interpreter on the CPU (a
    process of its own: the interpreter is chosen when Triton is imported): torch.topk(softmax)'s experts
    and renormalized weights, top-2 of 128 and top-8 of 256 and 64 experts."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    import os
    import subprocess

    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONWARNINGS": "ignore"}
    run = subprocess.run([sys.executable, "-c", ROUTING_CHECK], cwd=Path(gpu_check.__file__).parent, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]


# --- the command lines ------------------------------------------------------------------------------

def _refused(main, argv: list[str], capsys) -> str:
    """`main(argv)` must stop as argparse does on a bad argument (exit 2) before running anything: its error."""
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("main, argv", [
    (cpu_bench.main, ["--quick", "--only", "softmax", "--no-compile-times", "--repeats", "0"]),
    (compile_time.main, ["--tiny", "--repeats", "0"]),
    (call_overhead.main, ["--calls", "0", "--repeats", "1"]),
    (call_overhead.main, ["--calls", "10", "--repeats", "-1"]),
    (dynamic_shapes.main, ["--steps", "1", "--prompts", "1", "--repeats", "0"]),
    (dynamic_shapes.main, ["--steps", "0", "--prompts", "1", "--repeats", "1"]),
    (profile_case.main, ["attention f16 [4,16,4096,64]", "--calls", "0"]),
], ids=["cpu_bench", "compile_time", "call_overhead calls", "call_overhead repeats", "dynamic_shapes repeats",
        "dynamic_shapes steps", "profile_case"])
def test_counts_below_one_are_refused(main, argv, capsys):
    """A count of 0 emptied a median (a traceback), divided by zero, or printed inf/nan as a result."""
    assert "must be at least 1, got " in _refused(main, argv, capsys)


def test_cpu_bench_only_refuses_unknown_names_and_lists_the_rows(capsys):
    """A typo, or a workload's name where the row is named otherwise, ran no row and exited 0."""
    err = _refused(cpu_bench.main, ["--only", "softmax,sofmax,causal_attention"], capsys)
    assert "'sofmax'" in err and "'causal_attention' (the workload of row causal)" in err
    assert "choose from " + ", ".join(cpu_bench.ROWS) in err and "'softmax'" not in err


def test_cpu_bench_rows_are_the_names_only_accepts():
    """`ROWS` (what ``--only`` checks against without making gigabytes of arrays) is what `cases` makes."""
    made = cpu_bench.cases(True, np.random.default_rng(0))
    assert list(dict.fromkeys(name for name, *_ in made)) == list(cpu_bench.ROWS)
    assert all(cpu_bench.ROWS[name] is fn for name, fn, *_ in made)
    assert cpu_bench.workload_hints()["fp8_quant_gemm"] == "the workload of row fp8_gemm"
    assert "attention" not in cpu_bench.workload_hints()      # a row name itself


def test_cpu_bench_without_compile_times_prints_dashes(monkeypatch, capsys):
    """The skipped compile-time columns say "-" (not measured), as the torch columns do without a peer;
    they printed 0.00 0.0 0.0, a compile taking no time. (Times stubbed: nothing is timed here.)"""
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    monkeypatch.setattr(cpu_bench, "cases", lambda quick, rng: [("softmax", cpu_bench.softmax, [x], {}, 64)])
    monkeypatch.setattr(cpu_bench, "median_times", lambda fns, repeats: [1e-3] * len(fns))
    monkeypatch.setattr(cpu_bench, "compile_times", lambda *a: pytest.fail("compile times were skipped"))
    monkeypatch.setattr(cpu_bench, "torch_version", lambda name, args: None)
    cpu_bench.main(["--quick", "--only", "softmax", "--no-compile-times", "--repeats", "1"])
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("softmax")]
    assert row.split()[2:10] == ["1.0", "1.0", "1.00", "-", "-", "-", "-", "-"] and "ok" in row


def test_gpu_check_only_refuses_unknown_names_before_any_device(capsys):
    """device_check.sh passes ``--only`` through: a typo ran an empty table on a lent GPU and exited 0."""
    err = _refused(gpu_check.main, ["--dry-run", "--tiny", "--only", "softmax", "sofmax"], capsys)
    assert "unknown name 'sofmax'; choose from attention, attention_numpy_rules" in err
    err = _refused(gpu_check.main, ["--smoke-cpu", "--only", "gqa 32/8", "causal_attention"], capsys)
    assert "'gqa 32/8' (a case of the full shapes only" in err and "'causal_attention' (the workload of causal)" in err
    err = _refused(gpu_check.main, ["--dry-run", "--tiny", "--only", "softmax f16 [64,513]"], capsys)
    assert repr(gpu_cases.cases("tiny")[0].label) in err                # a mistyped label: the labels listed
    label = gpu_cases.cases("tiny")[-1].label
    picked = gpu_check.selected_cases(gpu_check.argparse.ArgumentParser(), ["softmax", label], "tiny")
    assert [c.label for c in picked] == [c.label for c in gpu_cases.cases("tiny")
                                         if c.name == "softmax" or c.label == label]


def test_the_device_check_checks_gpu_checks_arguments_before_the_device(capsys):
    """``gpu_check.py --check-args`` checks and runs nothing; device_check.sh calls it before its gate and
    tests, so that a typo in ``--only`` stops the script before the lease's time is spent."""
    assert gpu_check.main(["--check-args", "--only", "softmax", "gemm"]) == 0
    assert capsys.readouterr().out == "gpu_check: arguments ok, 6 case(s) selected\n"
    _refused(gpu_check.main, ["--check-args", "--only", "sofmax"], capsys)
    script = (BENCHMARKS / "device_check.sh").read_text()
    check = script.index('gpu_check.py --check-args --budget "$budget" "$@" || exit 2')
    assert check < script.index("python3 -P - <<'EOF'") < script.index("-m pytest")     # the gate, the tests


@pytest.mark.parametrize("main, argv, error", [
    (gpu_check.main, ["--dry-run", "--tiny", "--only", "gemm", "--budget", "-1"], "--budget: must be a number of "
                                                                                   "seconds above 0, got -1"),
    (gpu_check.main, ["--dry-run", "--tiny", "--only", "gemm", "--budget", "0"], "--budget: must be a number"),
    (gpu_check.main, ["--dry-run", "--tiny", "--only", "gemm", "--sm", "sm_99"], "--sm: unknown target 'sm_99'"),
    (static_counts.main, ["--tiny", "--sm", "sm_99"], "--sm: unknown target 'sm_99'; choose one of sm_75, "),
], ids=["gpu_check budget -1", "gpu_check budget 0", "gpu_check sm", "static_counts sm"])
def test_budgets_and_targets_are_checked_up_front(main, argv, error, capsys):
    """A budget of 0 or less skipped every case; an unknown target made every row the same cut-off error
    and exited 0."""
    assert error in _refused(main, argv, capsys)


def test_profile_case_without_a_device_or_with_an_unknown_label_says_so_in_one_line(monkeypatch):
    """Without a device it died in torch's traceback from the first tensor; an unknown label named no valid
    one. Each is one line and exit status 1 now, as gpu_check.py's refusal."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    label = gpu_cases.cases("full")[0].label
    with pytest.raises(SystemExit) as stopped:
        profile_case.main([label, "--calls", "1"])
    assert str(stopped.value.code).startswith("profile_case: torch sees no CUDA device")
    with pytest.raises(SystemExit) as stopped:
        profile_case.main(["attention f16 [4,16,4096,65]"])
    assert "no case labelled 'attention f16 [4,16,4096,65]'; the labels: " + repr(label) in str(stopped.value.code)


@pytest.mark.parametrize("module", [call_overhead, dynamic_shapes, gpu_check])
def test_help_describes_the_script_in_whole_sentences(module, monkeypatch, capsys):
    """``--help`` gives the docstring's first paragraph: its first line alone stopped mid-sentence."""
    monkeypatch.setenv("COLUMNS", "2000")                     # (no words broken at hyphens)
    with pytest.raises(SystemExit):
        module.main(["--help"])
    paragraph = " ".join(module.__doc__.strip().split("\n\n")[0].split())
    assert paragraph.endswith(".") and paragraph in " ".join(capsys.readouterr().out.split())



def test_the_device_checks_per_element_rule_fails_on_planted_wrong_outputs():
    """(Found by a helper.) One relative norm over the whole output passed an f16 softmax 0.8% too large, f32
    MoE weights 0.09% too large and an attention output with one query row never written; each element is
    held to the project's tolerance rule now (probabilities and weights to its relative part too), and the
    right outputs, rounded to their dtype, still pass."""
    torch = pytest.importorskip("torch")
    by_name = {c.workload: c for c in reversed(gpu_cases.cases("tiny"))}
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 512, generator=g, dtype=torch.float64) * 3
    ref = (torch.softmax(x, -1),)
    p = torch.softmax(torch.randn(256, 64, generator=g, dtype=torch.float64) * 3, -1)
    w3, i3 = torch.topk(p, 3)
    routing = (w3[:, :2] / w3[:, :2].sum(-1, keepdim=True), i3[:, :2], w3)
    out = torch.randn(1, 16, 4096, 64, generator=g, dtype=torch.float64) * 0.1
    unwritten = out.clone()
    unwritten[0, 3, 4095] = 0.0
    check = gpu_cases.check
    assert check(by_name["softmax"], "redfuser", ref[0].half(), ref, torch)[0]
    assert not check(by_name["softmax"], "redfuser", (ref[0] * 1.008).half(), ref, torch)[0]
    assert check(by_name["moe_routing"], "redfuser", (routing[0].float(), routing[1]), routing, torch)[0]
    assert not check(by_name["moe_routing"], "redfuser", ((routing[0] * 1.0009).float(), routing[1]), routing,
                     torch)[0]
    assert check(by_name["flash_attention_f16"], "redfuser", out.half(), (out,), torch)[0]
    assert not check(by_name["flash_attention_f16"], "redfuser", unwritten.half(), (out,), torch)[0]

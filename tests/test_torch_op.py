"""`redfuser.torch.op`: a kernel as a PyTorch custom op, in eager code, in an nn.Module and under
``torch.compile(fullgraph=True)`` with no graph break, its fake implementation's shapes from tracing
alone, a clear error where autograd would need a backward, and a clear error without torch."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import redfuser as rf
from redfuser.workloads import attention, layer_norm_stats, moe_routing, softmax

torch = pytest.importorskip("torch")
rft = pytest.importorskip("redfuser.torch")

SDPA = torch.nn.functional.scaled_dot_product_attention


@pytest.fixture(scope="module")
def ops():
    return {"softmax": rft.op(rf.kernel(softmax), "rftests::softmax"),
            "stats": rft.op(layer_norm_stats, "rftests::stats"),
            "route": rft.op(moe_routing, "rftests::route"),
            "attention": rft.op(rf.kernel(attention, block_m=16), "rftests::attention")}


def test_an_op_runs_the_kernel_on_cpu_tensors(ops):
    x = torch.randn(5, 37, generator=torch.Generator().manual_seed(0))
    got = ops["softmax"](x)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
    np.testing.assert_array_equal(got.numpy(), rf.kernel(softmax, backend="cpu")(x.numpy()))
    mu, var = ops["stats"](x)
    torch.testing.assert_close(mu, x.mean(-1, keepdim=True))
    weights, experts = ops["route"](x)
    assert experts.dtype == torch.int64
    assert torch.equal(experts, torch.topk(torch.softmax(x, -1), 2).indices)


def test_the_fake_implementation_gives_shapes_and_dtypes_without_compiling(ops):
    from torch._subclasses.fake_tensor import FakeTensorMode

    kernel = rf.kernel(moe_routing)
    with FakeTensorMode():
        weights, experts = ops["route"](torch.empty(1000, 64))
        assert (tuple(weights.shape), weights.dtype, tuple(experts.shape), experts.dtype) == (
            (1000, 2), torch.float32, (1000, 2), torch.int64)
    assert kernel.cache_info().misses == 0
    assert kernel.output_types(rf.ShapeDtype((1000, 64), np.float32))[1].dtype == np.int64


class Block(torch.nn.Module):
    def __init__(self, attend):
        super().__init__()
        self.attend = attend
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, q, k, v):
        return self.proj(self.attend(q, k, v)).relu()


def test_an_op_in_a_module_compiles_with_fullgraph_and_no_graph_break(ops):
    q, k, v = (torch.randn(2, 3, 20, 16, generator=torch.Generator().manual_seed(i)) for i in range(3))
    ours, stock = Block(ops["attention"]), Block(SDPA)
    stock.load_state_dict(ours.state_dict())
    with torch.no_grad():
        got = torch.compile(ours, fullgraph=True)(q, k, v)
        torch.testing.assert_close(got, stock(q, k, v), atol=1e-5, rtol=1e-5)
    import torch._dynamo as dynamo

    assert dynamo.explain(ours)(q, k, v).graph_break_count == 0


def test_symbolic_sizes_map_onto_one_graph_and_one_polymorphic_kernel(ops):
    """torch.compile's dynamic shapes: the fake implementation keeps the inputs' symbols in the results'
    shapes, so the graph is compiled once for every length, and the kernel behind the op serves every length
    with one shape-polymorphic compile after the first exact one."""
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    kernel = rf.kernel(attention, backend="cpu")
    op = rft.op(kernel, "rftests::attention_dyn")
    compiled = torch.compile(lambda q, k, v: op(q, k, v) * 2, fullgraph=True, dynamic=True, backend=counting)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n in (5, 19, 64, 3):
            q, k, v = (torch.randn(2, n, 16, generator=gen) for _ in range(3))
            torch.testing.assert_close(compiled(q, k, v), SDPA(q, k, v) * 2, atol=1e-5, rtol=1e-5)
    assert len(graphs) == 1
    assert op.kernels["cpu"].cache_info().misses == 2      # the first length exactly, then one class


def test_autograd_is_refused_with_a_clear_error(ops):
    x = torch.randn(3, 8, requires_grad=True)
    with pytest.raises(rf.UnsupportedError, match="has no backward"):
        ops["softmax"](x)
    with torch.no_grad():
        assert ops["softmax"](x).shape == (3, 8)
    with pytest.raises(rf.ArgumentError, match="requires grad"):
        rf.kernel(softmax, backend="cpu")(x)


def test_an_op_name_must_be_namespace_and_name(ops):
    with pytest.raises(rf.ArgumentError, match="namespace::name"):
        rft.op(softmax, "no_namespace")


def test_the_example_layer_equals_the_stock_one():
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, str(root / "examples" / "torch_attention.py")], capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0 and "max |difference|" in run.stdout, run.stderr[-3000:]


def test_without_torch_redfuser_imports_and_the_op_says_what_to_install():
    script = ("import sys; sys.modules['torch'] = None\n"
              "import redfuser as rf, redfuser.torch as rft\n"
              "from redfuser.workloads import softmax\n"
              "try:\n    rft.op(softmax, 'a::b')\nexcept rf.BackendError as e:\n    print('refused:', e)\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "refused: redfuser.torch needs PyTorch" in run.stdout, run.stderr
    assert "pip install -e '.[torch]'" in run.stdout


def _scaled(x, scale):
    return x * scale


def _scaled_by_default(x, scale=0.5):
    return x * scale


def _iota():
    return rf.arange(3)


def _added(x, y):
    return x + y


def test_an_op_takes_the_parameters_without_a_default_by_position_or_name():
    """(Trying the project as a new user.) A ``functools.partial`` kernel or one with a defaulted static value
    became an op whose schema asked a Tensor for that parameter, which no call could give; keyword arguments
    were a TypeError; a kernel without array parameters failed under torch.compile (IndexError)."""
    import functools

    ones = torch.ones(2)
    assert torch.equal(rft.op(rf.kernel(functools.partial(_scaled, scale=3.0)), "rftests::scaled")(ones), ones * 3)
    by_default = rft.op(rf.kernel(_scaled_by_default), "rftests::scaled_by_default")
    assert torch.equal(by_default(ones), ones / 2) and torch.equal(by_default(x=ones), ones / 2)
    iota = rft.op(rf.kernel(_iota), "rftests::iota")
    assert torch.equal(torch.compile(lambda: iota(), fullgraph=True)(), torch.arange(3))
    added = rft.op(rf.kernel(_added), "rftests::added")
    assert torch.equal(added(ones, y=ones), ones * 2)
    with pytest.raises(rf.ArgumentError, match="takes \\(x, y\\)"):
        added(ones, x=ones)

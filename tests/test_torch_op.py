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


@pytest.mark.parametrize("name, dynamic, misses", [("true", True, 1), ("false", False, 3),
                                                   ("named_rows", {"x": (0,)}, 3), ("automatic", None, 2)])
def test_an_ops_kernels_keep_the_kernels_dynamic_choice(name, dynamic, misses):
    """`op` rebuilds the kernel per device from its body and options; ``dynamic=`` is not an option, and was
    dropped: a ``dynamic=True`` kernel compiled its first length exactly, ``False`` and ``{"x": (0,)}``
    made a class of the row length, which they keep static."""
    op = rft.op(rf.kernel(softmax, dynamic=dynamic), f"rftests::softmax_dynamic_{name}")
    gen = torch.Generator().manual_seed(3)
    for n in (5, 9, 13):
        x = torch.randn(2, n, generator=gen)
        torch.testing.assert_close(op(x), torch.softmax(x, -1))
    assert op.kernels["cpu"].dynamic == dynamic
    assert op.kernels["cpu"].cache_info().misses == misses


def _compiled_graphs(fn, name, dynamic=True):
    """`fn` as an op under ``torch.compile(fullgraph=True, dynamic=True)``, and the list of graphs it makes
    (compiled by inductor, whose code asserts that each result has the size the fake implementation said)."""
    from torch._inductor.compile_fx import compile_fx

    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return compile_fx(gm, example_inputs)

    torch._dynamo.reset()
    op = rft.op(rf.kernel(fn, backend="cpu"), f"rftests::{name}")
    return torch.compile(lambda *a: op(*a), fullgraph=True, dynamic=dynamic, backend=counting), graphs


def _joined(x, y):
    return rf.concatenate([x, y], axis=0) * 2.0


def _flattened(x):
    return rf.reshape(x, (-1,)) + 1.0


def _sliced(x):
    return x[:, 1:] * 2.0


def _strided(x):
    return x[:, ::2] - 1.0


def _branching(x):
    if x.shape[-1] > 6:       # a decision on a symbolic length: the graph is guarded on it
        return rf.sum(x, axis=-1, keepdims=True)
    return x * 2.0


@pytest.mark.parametrize("fn, make", [
    (_joined, lambda n, g: (torch.randn(n, generator=g), torch.randn(n + 3, generator=g))),
    (_flattened, lambda n, g: (torch.randn(n, n + 1, generator=g),)),
    (_sliced, lambda n, g: (torch.randn(4, n, generator=g),)),
    (_strided, lambda n, g: (torch.randn(4, n, generator=g),)),
    (_branching, lambda n, g: (torch.randn(4, n, generator=g),)),
], ids=["concatenate", "reshape", "slice", "step", "branch"])
def test_results_whose_lengths_are_not_an_input_symbol_are_guarded_to_their_lengths(fn, make):
    """A result length that is some other function of symbolic sizes (n + m, n * m, n - 1, n // 2), or a
    body's decision on one, cannot be a symbol of the graph: the fake implementation guards those sizes to
    their values (one graph per length, as the kernel behind it specializes on them), and a static length
    that equals a probe is not taken for a symbol. Before, the fake mapped only probe lengths back, and
    every one of these failed under torch.compile."""
    compiled, graphs = _compiled_graphs(fn, f"guarded_{fn.__name__.strip('_<>')}")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n in (9, 5):
            args = make(n, gen)
            got, want = compiled(*args), fn(*(a.numpy() for a in args))
            assert tuple(got.shape) == want.shape
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-6)
    assert 1 <= len(graphs) <= 2


def _doubled(x):
    return x * 2.0


def test_a_static_length_equal_to_a_probe_is_not_taken_for_a_symbol():
    """torch.compile's automatic dynamic shapes: the second call makes the first axis symbolic and keeps the
    second (10007, the first probe) static; the fake gave the result (s0, s0). Such a call's symbols are
    guarded to their lengths (one graph per length, as the kernel behind it compiles such calls exactly)."""
    compiled, graphs = _compiled_graphs(_doubled, "probe_length", dynamic=None)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n in (3, 4, 6):
            x = torch.randn(n, 10007, generator=gen)
            torch.testing.assert_close(compiled(x), x * 2)
    assert len(graphs) == 3


def test_separately_symbolic_lengths_the_body_needs_equal_share_one_graph():
    """Without duck shaping (or with lengths that come from different places) torch gives equal lengths
    separate symbols; a body that adds them fails to trace at distinct probes, so the fake asserts them
    equal (torch._check) and the one graph serves every length."""
    import torch.fx.experimental._config as fx_config

    def add(x, y):
        return rf.exp(x) + y

    compiled, graphs = _compiled_graphs(add, "separately_symbolic")
    gen = torch.Generator().manual_seed(0)
    with fx_config.patch(use_duck_shape=False), torch.no_grad():
        for n in (5, 7, 9):
            x, y = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
            torch.testing.assert_close(compiled(x, y), torch.exp(x) + y)
    assert len(graphs) == 1


def test_symbolic_output_types_without_torch():
    """The rules behind the fake implementation, on plain symbols (redfuser.symbolic_results)."""
    from redfuser.symbolic_results import symbolic_output_types

    values = {"n": 7, "m": 7, "k": 9}
    f32 = np.dtype(np.float32)

    def types(fn, *shapes):
        return symbolic_output_types(rf.kernel(fn).output_types, [(s, f32) for s in shapes], values.get)

    plain = types(softmax, ("n", 16))
    assert plain.results == ((("n", 16), f32),) and not plain.specialized and not plain.merged
    joined = types(_joined, ("n",), ("k",))
    assert joined.results == (((16,), f32),) and joined.specialized == {"n", "k"}
    added = types(lambda x, y: x + y, ("n",), ("m",))
    assert added.results == ((("n",), f32),) and added.merged == (("n", "m"),)
    with pytest.raises(rf.ShapeError, match="do not broadcast"):
        types(lambda x, y: x + y, ("n",), ("k",))      # 7 and 9: the user's own error, at their values
    probe = types(lambda x: x * 2.0, ("n", 10007))
    assert probe.results == (((7, 10007), f32),) and probe.specialized == {"n"}


def test_autograd_is_refused_under_torch_compile_too():
    """Before, the refusal in the op's Python wrapper was traced by dynamo, which could not construct the
    error (a dynamo 'super() attribute' error); the refusal now comes from the op's autograd setup."""
    op = rft.op(rf.kernel(softmax, backend="cpu"), "rftests::softmax_grad_compiled")
    compiled = torch.compile(lambda x: op(x), fullgraph=True)
    with pytest.raises(Exception, match=r"has no backward \(RedFuser compiles forward kernels only\)"):
        compiled(torch.randn(3, 8, requires_grad=True))


def test_autograd_is_refused_with_a_clear_error(ops):
    x = torch.randn(3, 8, requires_grad=True)
    with pytest.raises(rf.UnsupportedError, match="has no backward"):
        ops["softmax"](x)
    with torch.no_grad():
        assert ops["softmax"](x).shape == (3, 8)
    with pytest.raises(rf.ArgumentError, match="requires grad"):
        rf.kernel(softmax, backend="cpu")(x)


@pytest.mark.parametrize("name", ["no_namespace", "a::class", "def::f", "a::None", "a::__init__", "a::\u00e9"])
def test_an_op_name_must_be_namespace_and_name_as_torch_takes_them(name):
    """Names torch's schema parser cannot take crashed inside torch (a RuntimeError, an AttributeError, a
    UnicodeDecodeError; found by a helper): refused first, naming the rule."""
    with pytest.raises(rf.ArgumentError, match="namespace::name"):
        rft.op(softmax, name)


def _doubled_rows_in_a_tuple(x):
    return (rf.sum(x, axis=-1) * 2,)


def test_a_body_returning_a_one_tuple_gives_a_one_tuple_eagerly_and_compiled():
    """(Found by a helper.) The op unpacked a single result, where the kernel and numpy's body give ``(y,)``:
    ``op(x)[0]`` was the first element of ``y``. Compiled first, so the fake run alone tells the op."""
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    op = rft.op(rf.kernel(_doubled_rows_in_a_tuple), "rftests::one_tuple")
    compiled = torch.compile(lambda t: op(t), fullgraph=True)(x)
    eager = op(x)
    want = _doubled_rows_in_a_tuple(x.numpy())
    for got in (compiled, eager):
        assert isinstance(got, tuple) and len(got) == 1
        np.testing.assert_array_equal(got[0].numpy(), want[0])


def test_each_op_compiles_alone_past_torchs_recompile_limit():
    """(Found by a helper.) Every op shared one code object, so torch.compile counted each op compiled alone
    as a recompile of it, and the ninth failed under ``fullgraph=True``: each op has its own now."""
    x = torch.ones(2, 3)
    limit = torch._dynamo.config.recompile_limit if hasattr(torch._dynamo.config, "recompile_limit") else 8
    made = [rft.op(rf.kernel(softmax), f"rftests::alone{i}") for i in range(limit + 1)]
    for op in made:
        torch.compile(op, fullgraph=True)(x)


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


def test_rf_torch_is_reachable_as_an_attribute_after_importing_redfuser_alone():
    """(Trying the project as a new user.) ``import redfuser as rf`` then ``rf.torch.op(...)`` raised
    "redfuser has no 'torch'": the submodule is imported on first use, as ``rf.testing`` is."""
    script = ("import redfuser as rf\n"
              "from redfuser.workloads import softmax\n"
              "print(type(rf.torch.op(softmax, 'lazy::softmax')).__name__)\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip(), run.stderr[-3000:]


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
    # (found by a helper) a keyword that skips a parameter took its place: torch then blamed the keyword given
    with pytest.raises(rf.ArgumentError, match="takes \\(x, y\\); x is not given"):
        added(y=ones)


def test_a_16_bit_result_comes_back_as_a_tensor_on_every_call():
    """A bfloat16 or float8 result of CPU tensors: the cached call path handed numpy's ml_dtypes array to
    ``torch.from_numpy``, a bare TypeError on the second call (eagerly, and under torch.compile, whose fake
    pass makes the first)."""
    def to_bf16(x):
        return (x * 2).astype(rf.bfloat16)

    kernel = rf.kernel(to_bf16, backend="cpu")
    op = rft.op(to_bf16, "rftests::to_bf16")
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(3))
    for call in (kernel, kernel, op, op):
        got = call(x)
        assert got.dtype == torch.bfloat16 and torch.equal(got.view(torch.int16), (x * 2).to(torch.bfloat16).view(torch.int16))

    def made():        # no tensor argument: the kernel's result is a numpy bfloat16 array, handed to torch by its bits
        return rf.arange(4, dtype=rf.float32).astype(rf.bfloat16)

    op = rft.op(made, "rftests::made_bf16")
    assert torch.equal(op().view(torch.int16), torch.arange(4, dtype=torch.bfloat16).view(torch.int16))


def test_an_op_name_registered_twice_sparse_tensors_and_other_dtypes_are_refused_clearly():
    """A second op of one name silently made the first run the second kernel; a sparse tensor gave a bare
    BufferError; a float64 tensor's error named the kernel and pointed into torch's own code."""
    op = rft.op(lambda x: x * 2.0, "rftests::twice")
    with pytest.raises(rf.ArgumentError, match="already registered"):
        rft.op(lambda x: x * 3.0, "rftests::twice")
    assert torch.equal(op(torch.ones(3)), torch.full((3,), 2.0))
    with pytest.raises(rf.ArgumentError, match=r"rftests::twice's argument 'x' is a torch.sparse_coo tensor"):
        op(torch.eye(3).to_sparse())
    with pytest.raises(rf.ArgumentError, match=r"rftests::twice's argument 'x' is a tensor of torch.float64") as err:
        op(torch.ones(3, dtype=torch.float64))
    assert "test_torch_op.py" in str(err.value)


def test_a_body_that_loops_over_a_length_is_specialized_without_tracing_the_probe():
    """``for i in range(1, x.shape[1])`` at the probe length 10009 traced ten thousand iterations: minutes
    under torch.compile(dynamic=True), and for a kernel's second length. The trace now stops where it
    indexes past the call's own length; an assert on a length in the body is the user's, not an error."""
    def unrolled(x):
        assert x.shape[1] % 1 == 0
        acc = x[:, 0]
        for i in range(1, x.shape[1]):
            acc = rf.maximum(acc, x[:, i])
        return acc

    kernel = rf.kernel(unrolled, backend="cpu")
    for n in (4, 5):
        x = np.random.default_rng(n).standard_normal((8, n)).astype(np.float32)
        np.testing.assert_array_equal(kernel(x), x.max(1))
    assert "uses the length x.1 as a number" in " ".join(kernel.polymorphism.values())
    op = rft.op(unrolled, "rftests::unrolled")
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(5))
    assert torch.equal(torch.compile(op, fullgraph=True, dynamic=True)(x), x.max(1).values)


def _largest(x):
    return rf.max(x, axis=0)     # (not a sum: one of e4m3 values is refused, as numpy adds them in e4m3)


def _count():
    return rf.sum(rf.arange(5))


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float32"])
def test_a_0_d_result_stays_0_d_eagerly_and_under_torch_compile(dtype):
    """A 0-d bfloat16 or float8 result came back of shape (1,) (``np.ascontiguousarray`` gives at least one
    dimension), from a plain kernel and an op, and an op without tensor arguments did so for every dtype:
    under torch.compile the fake result is 0-d, so inductor's code asserted on it."""
    dt = getattr(torch, dtype)
    x = torch.tensor([1.0, 3.0, 2.0]).to(dt)
    want = x.float().max().to(dt)
    op = rft.op(_largest, f"rftests::largest_{dtype}")
    for call in (rf.kernel(_largest, backend="cpu"), rf.kernel(_largest, backend="interpret"), op, op):
        got = call(x)
        assert got.shape == () and got.dtype == dt and torch.equal(got.float(), want.float())
    compiled = torch.compile(lambda t: op(t).float() + 1, fullgraph=True)(x)
    assert compiled.shape == () and torch.equal(compiled, want.float() + 1)


def test_a_0_d_result_of_an_op_without_tensor_arguments_stays_0_d():
    count = rft.op(_count, "rftests::count")
    assert np.shape(_count()) == () and count().shape == () and count().item() == 10
    compiled = torch.compile(lambda: count() + 1, fullgraph=True)()
    assert compiled.shape == () and compiled.item() == 11


def _shifted(x, *, y, scale=2.0):
    return (x - y) * scale


def _scaled_first(scale, x):
    return x * scale


def test_keyword_only_parameters_are_passed_to_the_kernel_by_name():
    """``def k(x, *, y)`` became an op of schema (Tensor x, Tensor y) that called the kernel positionally:
    every call failed ('too many positional arguments', pointing into torch). So did a functools.partial
    that binds an earlier parameter by name (the later ones become keyword-only)."""
    import functools

    x, y = torch.arange(3.0), torch.full((3,), 5.0)
    shifted = rft.op(_shifted, "rftests::shifted")
    for got in (shifted(x, y=y), shifted(x, y), shifted(y=y, x=x),
                torch.compile(lambda a, b: shifted(a, y=b), fullgraph=True)(x, y)):
        assert torch.equal(got, (x - y) * 2)
    tripled = rft.op(functools.partial(_scaled_first, scale=3.0), "rftests::tripled")
    assert torch.equal(tripled(x), x * 3) and torch.equal(tripled(x=x), x * 3)


def test_a_name_torch_already_has_is_refused_whoever_defined_it():
    """Only names registered by redfuser.torch.op were refused: one the user defined with
    torch.library.custom_op was silently taken over (its callers ran the kernel, and got a list)."""
    @torch.library.custom_op("rftests::theirs", mutates_args=())
    def theirs(x: torch.Tensor) -> torch.Tensor:
        return x + 100

    torch.library.define("rftests::declared", "(Tensor x) -> Tensor")
    for name in ("rftests::theirs", "rftests::declared"):
        with pytest.raises(rf.ArgumentError, match=f"the op {name} is already defined in torch's operator registry"):
            rft.op(lambda x: x * 2, name)
    assert torch.equal(torch.ops.rftests.theirs(torch.ones(2)), torch.full((2,), 101.0))


def _rest(x):
    return x[1:]


def test_a_data_dependent_length_stays_symbolic_or_is_refused_clearly():
    """Under capture_dynamic_output_shape_ops, ``op(x[x > 0])`` has an unbacked length u0 without a value:
    the fake implementation asked every symbol for its value (int(u0)), so torch raised its own UserError
    with no word of RedFuser, even where the result's length is u0 itself and needs no value."""
    import torch._dynamo

    doubled = rft.op(_doubled, "rftests::doubled_masked")
    rest = rft.op(_rest, "rftests::rest_masked")
    x = torch.tensor([1.0, -2.0, 3.0, 4.0])
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        for backend in ("aot_eager", "inductor"):
            torch._dynamo.reset()
            got = torch.compile(lambda t: doubled(t[t > 0]) + 1, fullgraph=True, backend=backend)(x)
            assert torch.equal(got, x[x > 0] * 2 + 1)
        torch._dynamo.reset()
        with pytest.raises(Exception, match=r"rftests::rest_masked's results need the value of the data-dependent "
                                            r"length u\d+ \(a length of argument 'x'\)"):
            torch.compile(lambda t: rest(t[t > 0]), fullgraph=True, backend="aot_eager")(x)
    assert torch.equal(rest(x), x[1:])      # (eagerly every length is known)


def test_symbolic_output_types_of_a_length_without_a_value():
    from redfuser.symbolic_results import DataDependentLength, symbolic_output_types

    f32 = np.dtype(np.float32)

    def types(fn, *shapes):
        return symbolic_output_types(rf.kernel(fn).output_types, [(s, f32) for s in shapes], {"n": 5}.get)

    assert types(softmax, ("u0", 16)).results == ((("u0", 16), f32),)
    with pytest.raises(DataDependentLength, match="data-dependent length.* u0") as err:
        types(_rest, ("u0",))           # (u0 - 1: traced at values only)
    assert err.value.symbols == ("u0",) and isinstance(err.value, rf.RedFuserError)
    with pytest.raises(DataDependentLength):
        types(lambda x, y: x + y, ("u0",), ("n",))     # (equal lengths: merged by equal values, which u0 lacks)

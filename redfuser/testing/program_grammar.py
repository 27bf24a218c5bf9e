"""The whole-compiler fuzzer's grammar: random programs over every op of the subset, as data.

`draw_program(draw)` builds a `Program` node by node. Each node is run on numpy
as it is drawn (through the oracle, `program_oracle`), so the grammar knows
every value's dtype, shape, exactness and error bound, and draws only what the
oracle can judge: discontinuous ops (comparisons, casts to int or bool, top-k
indices) get exact operands; ``log``, ``sqrt`` and divisions get either exact
operands or the guarded forms (``log(|x| + 1)``); a node that would leave an
element the oracle cannot judge is drawn again.

What is drawn:

- dtypes f32, f16, bf16, int32 and bool (mixed with f32 masks and int32 data),
  casts between them, to int64 and to float8_e4m3fn (narrowing included);
- shapes of 0-3 dims from tiny and odd sides (1, 2, 3, 5, 7, 13...), sometimes
  one long axis; inputs broadcast against each other;
- elementwise arithmetic (bool and integer included: ``a * b`` of bools is AND),
  comparisons, ``& | ~``, ``where``, math functions; reductions (axis None, int,
  negative, tuple; keepdims); ``@`` (1-d operands too); top-k (values, indices,
  both); views (``swapaxes``, ``transpose``, ``.T``, ``.mT``, indexing with
  ``None``, ``...``, ints); ``arange`` masks (causal, sliding window);
- idioms from `program_idioms` (softmax, attention with masks, MoE routing,
  absmax FP8 quantization, layer-norm statistics, log-sum-exp);
- static scalar arguments (runs such as ``2, 2.0, True, np.float32(2)`` or
  ``0.0, -0.0``) and kernel options (block sizes, ``split``, ``num_warps``,
  ``prefetch``, ``skip_masked``, ``interpret_chunk``, ``fuse``, ``sm``);
- the calls: the same kernel object called again with the run's other scalars,
  new data, the same data as a broadcast, negative-stride, Fortran-order or
  sliced view, or a masked array, and new data at other lengths (the kernel then
  makes the changed axes symbolic: one shape-polymorphic kernel, `redfuser.shapes`).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import replace
from typing import Sequence

import numpy as np

from .cascades import Draw
from .program import Arg, Node, Program
from .program_data import SCALAR_FAMILIES, ArrayData
from .program_oracle import Value, _argument, _step, is_float

SIDES = (1, 2, 3, 4, 5, 7, 8, 13, 16, 17, 31, 33)
LONG_SIDES = (64, 100, 127, 257, 1000)
FLOAT_KINDS = ("normal", "normal", "wide", "ints", "ints", "large", "positive")
SPECIALS = (float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 65504.0, 1e-30)
OPTION_CHOICES: dict[str, tuple] = {
    "block_m": (1, 2, 3, 4, 8, 16, 64),
    "block_n": (1, 2, 4, 7, 16, 32, 128),
    "block_k": (1, 2, 3, 8, 16, 32, 128),
    "split": (1, 2, 3, 4),
    "num_warps": (1, 2, 4, 8),
    "prefetch": (True,),
    "skip_masked": (True, False),
    "interpret_chunk": (1, 2, 3, 7),
    "fuse": (False,),
    "num_threads": (1, 2),
    "sm": ("sm_80", "sm_90a"),   # simulate: Ampere's mma.sync without FP8, or Hopper's wgmma (an H100's default)
    "tma": (False,),             # sm_90a's operand tiles staged by the threads instead of the copy engine
    "tma_stages": (1, 4),        # a TMA staging point in a loop without a ring, or with four stages
    "whole_max": (4, 32),        # state axes past it tiled across the grid, their programs recomputing the rest
    "shifted_exp": (False,),     # every exp the accurate one, exp(x - max) included
}


class ProgramBuilder:
    """Draws one program (see the module docstring); `env` holds the first call's values."""

    def __init__(self, draw: Draw, max_size: int = 256) -> None:
        self.draw = draw
        self.max_size = max_size
        self.params: list[str] = []
        self.args: list[Arg] = []
        self.families: dict[str, tuple] = {}
        self.nodes: list[Node] = []
        self.env: dict[str, Value] = {}
        self.labels: list[str] = []
        self.count = 0
        self.refused = False     # the program ends in a node numpy refuses (`refuse`)

    # -- values ----------------------------------------------------------------------------------
    def fresh(self) -> str:
        self.count += 1
        return f"v{self.count - 1}"

    def info(self, name: str) -> Value:
        return self.env[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return np.shape(self.env[name].ref)

    def dtype(self, name: str) -> np.dtype:
        return self.env[name].dtype

    def is_scalar(self, name: str) -> bool:
        return name in self.families

    def arrays(self, ok=lambda n: True) -> list[str]:
        return [n for n in self.env if not self.is_scalar(n) and ok(n)]

    def new_input(self, shape: tuple[int, ...], dtype: str, kind: str | None = None) -> str:
        d = self.draw
        if kind is None:
            kind = {"bool": "bool", "int32": d.pick(("int_small", "int_small", "int_wide", "int_edge"))}.get(
                dtype, d.pick(FLOAT_KINDS))
        base = None
        if shape and d.chance(20):  # values constant along some dims: a broadcast view can present them
            base = tuple(1 if d.chance(50) else s for s in shape)
            base = base if base != shape else None
        size = math.prod(base or shape)
        specials: tuple = ()
        if dtype not in ("bool", "int32") and size and d.chance(30):
            specials = tuple((d.integer(0, size - 1), d.pick(SPECIALS)) for _ in range(d.integer(1, 3)))
        data = ArrayData(dtype, shape, base, d.integer(0, 2**31 - 1), kind, specials, mask_seed=d.integer(0, 999))
        name = f"x{sum(1 for a in self.args if a.is_array)}"
        self.params.append(name)
        self.args.append(Arg(data))
        self.env[name] = _argument(data.build())
        return name

    def new_scalar(self) -> str:
        family = self.draw.pick(SCALAR_FAMILIES)
        name = f"s{len(self.families)}"
        self.params.append(name)
        self.args.append(Arg(scalar=family[0]))
        self.families[name] = family
        self.env[name] = _argument(family[0])
        return name

    def add(self, op: str, args: Sequence[str], params: tuple = (), outs: int = 1) -> str | None:
        """Append `op` when numpy accepts it and the oracle can judge every element; its (first) output."""
        names = tuple(self.fresh() for _ in range(outs))
        node = Node(names, op, tuple(args), params)
        trial = dict(self.env)
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")     # numpy's own (var with ddof >= n): judged, not printed
                _step(node, trial)
        except Exception:
            return None
        new = [trial[n] for n in names]
        if any(np.asarray(v.unsure).any() for v in new) or any(math.prod(np.shape(v.ref)) > 4 * self.max_size
                                                                 for v in new):
            return None
        self.env = trial
        self.nodes.append(node)
        return names[0]

    def refuse(self, op: str, args: Sequence[str], params: tuple = ()) -> bool:
        """Append a node numpy refuses (the kernel must refuse it with a user error)."""
        node = Node((self.fresh(),), op, tuple(args), params)
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                _step(node, dict(self.env))
        except Exception:
            self.nodes.append(node)
            self.refused = True
            return True
        return False

    def pick(self, ok=lambda n: True, latest: bool = True) -> str | None:
        names = self.arrays(ok)
        if not names:
            return None
        if latest and self.nodes and self.draw.chance(60):
            last = [n for n in self.nodes[-1].outs if n in names]
            if last:
                return last[0]
        return self.draw.pick(names)

    # -- shapes ----------------------------------------------------------------------------------
    def base_shape(self) -> tuple[int, ...]:
        d = self.draw
        ndim = d.pick((0, 1, 1, 2, 2, 2, 3, 3))
        shape: list[int] = []
        for _ in range(ndim):
            room = self.max_size // max(math.prod(shape), 1)
            shape.append(d.pick([s for s in SIDES if s <= room] or [1]))
        if shape and d.chance(12):  # one long axis: many chunks, splits, tail masks
            room = 4 * self.max_size // max(math.prod(shape[:-1]), 1)
            shape[-1] = d.pick([s for s in LONG_SIDES if s <= room] or [shape[-1]])
        return tuple(shape)

    def broadcastable(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        drop = self.draw.integer(0, len(shape)) if self.draw.chance(30) else 0
        return tuple(1 if self.draw.chance(20) else s for s in shape[drop:])

    # -- the program -------------------------------------------------------------------------------
    def finish(self, outputs: list[str]) -> Program:
        calls = _calls(self, tuple(self.args))
        return Program(tuple(self.params), tuple(self.nodes), tuple(outputs), calls, _options(self.draw, self),
                       "+".join(self.labels))


def _calls(b: ProgramBuilder, first: tuple[Arg, ...]) -> tuple[tuple[Arg, ...], ...]:
    """The call on the drawn arguments, then the same kernel object called again (see the module docstring)."""
    d = b.draw
    calls = [first]
    for name, family in b.families.items():
        k = b.params.index(name)
        for value in family[1:d.integer(1, len(family) - 1) + 1]:
            calls.append(tuple(Arg(scalar=value) if n == k else a for n, a in enumerate(calls[-1])))
    if d.chance(25):  # new data, same shapes: the cached kernel on other values
        calls.append(tuple(Arg(_reseed(a.data, d)) if a.is_array else a for a in first))
    if d.chance(45):  # the same values in other layouts
        layouts = []
        for a in first:
            if not a.is_array or not a.data.shape:
                layouts.append("c")
                continue
            options = ["F", "rev", "strided", "c"] + (["bcast", "bcast"] if a.data.base is not None else [])
            layouts.append(d.pick(options + (["masked"] if d.chance(15) else [])))
        if any(x != "c" for x in layouts):
            calls.append(tuple(Arg(a.data, x) if a.is_array else a for a, x in zip(first, layouts)))
    if not b.refused and d.chance(30):  # other lengths: the changed axes become symbolic (redfuser.shapes)
        resized = _resized(d, first)
        if resized is not None:
            calls.append(resized)
    return tuple(calls)


def _resized(d: Draw, first: tuple[Arg, ...]) -> tuple[Arg, ...] | None:
    """The first call's arrays at other lengths: each length >= 2 (the same one wherever it occurs, so what
    broadcast or contracted together still does) replaced by a drawn one in [2, n + 5]; values drawn anew
    (specials kept where they still fit); None when no array has such a length. Not for a program drawn to
    end in a refusal: at other lengths the refused node (a top-k of more than the axis) may be valid, and
    its one output name would stand for two results."""
    lengths = sorted({n for a in first if a.is_array for n in a.data.shape + (a.data.base or ()) if n >= 2})
    if not lengths:
        return None
    new = {n: d.integer(2, n + 5) for n in lengths}
    out = []
    for a in first:
        if not a.is_array:
            out.append(a)
            continue
        data = a.data
        shape = tuple(new.get(n, n) for n in data.shape)
        base = tuple(new.get(n, n) for n in data.base) if data.base is not None else None
        size = math.prod(base if base is not None else shape)
        specials = tuple((pos, v) for pos, v in data.specials if pos < size)
        out.append(Arg(replace(data, shape=shape, base=base, values=None, specials=specials), "c"))
    return tuple(out)


def _reseed(data: ArrayData, d: Draw) -> ArrayData:
    return replace(data, seed=d.integer(0, 2**31 - 1))


def _options(d: Draw, b: ProgramBuilder) -> tuple[tuple[str, object], ...]:
    if not d.chance(55):
        return ()
    names = sorted(OPTION_CHOICES)
    chosen = {n: d.pick(OPTION_CHOICES[n]) for n in names if d.chance(25)}
    if chosen.get("skip_masked") and _has_nonfinite_inputs(b):
        chosen.pop("skip_masked")  # exact for finite data only (schedule/masked.py): a documented divergence
    return tuple(sorted(chosen.items()))


def _has_nonfinite_inputs(b: ProgramBuilder) -> bool:
    return any(a.is_array and a.data.specials for a in b.args) or bool(b.families)


def floats(b: ProgramBuilder, name: str) -> bool:
    """Whether value `name` is a float (f16, bf16, e4m3 included)."""
    return is_float(b.dtype(name))


STEP_WEIGHTS = (("unary", 5), ("binary", 7), ("reduce", 4), ("matmul", 2), ("topk", 1), ("view", 2), ("scalar", 1))
DTYPE_WEIGHTS = (("float32", 7), ("float16", 3), ("bfloat16", 2), ("int32", 4), ("bool", 3))


def _weighted(d: Draw, table: tuple[tuple[str, int], ...]) -> str:
    return d.pick([name for name, w in table for _ in range(w)])


def draw_program(d: Draw, max_size: int = 256, max_steps: int = 8) -> Program:
    """A random program (see the module docstring), reproducible from `d`'s choices."""
    from . import program_idioms, program_steps

    b = ProgramBuilder(d, max_size)
    dtype = _weighted(d, DTYPE_WEIGHTS)
    steps = {"unary": program_steps.unary, "binary": program_steps.binary, "reduce": program_steps.reduce,
             "matmul": program_steps.matmul, "topk": program_steps.topk, "view": program_steps.view,
             "scalar": program_steps.scalar}
    if d.chance(35):
        float_dtype = dtype if dtype in ("float32", "float16", "bfloat16") else "float32"
        program_idioms.idiom(b, d.pick(program_idioms.IDIOMS), float_dtype)
    if not b.nodes or d.chance(70):
        b.new_input(b.base_shape(), dtype)
        if d.chance(40):
            b.new_input(b.broadcastable(b.shape(b.params[0])), dtype if d.chance(60) else "float32")
        for _ in range(d.integer(1, max_steps)):
            a = b.pick()
            if a is None:
                break
            kind = _weighted(d, STEP_WEIGHTS)
            if not steps[kind](b, a):
                program_steps.unary(b, a)
        if d.chance(3):
            a = b.pick()
            if a is not None and program_steps.refusal(b, a):
                return b.finish([b.nodes[-1].outs[0]])
    values = [n for node in b.nodes for n in node.outs if n in b.env]
    if not values:  # nothing was drawn: return an input through one node
        values = [b.add("neg" if b.dtype(b.params[0]) != "bool" else "not", [b.params[0]]) or b.params[0]]
    outputs = [values[-1]]
    for _ in range(d.integer(0, 2)):
        extra = d.pick(values)
        if extra not in outputs:
            outputs.append(extra)
    return b.finish(outputs)

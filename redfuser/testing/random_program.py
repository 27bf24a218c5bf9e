"""Random kernel bodies as data: a list of `Step`s run by a closure over ``redfuser`` ops.

No source is generated or ``exec``-ed: `RandomProgram.body` interprets the steps,
so the same callable traces into a kernel and runs on numpy as the reference.
Its ``repr`` is the program as Python source, for failure reports.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

import redfuser as rf


def _key_text(key: tuple) -> str:
    return ", ".join("None" if k is None else "..." if k is Ellipsis else ":" if isinstance(k, slice) else str(k)
                     for k in key)


# op -> (apply(a, b, params), source template). `b` is None for one-operand steps.
STEP_RULES: dict[str, tuple[Callable, str]] = {
    "neg": (lambda a, b, p: -a, "-{a}"),
    "abs": (lambda a, b, p: rf.abs(a), "rf.abs({a})"),
    "exp": (lambda a, b, p: rf.exp(rf.minimum(a, 4.0)), "rf.exp(rf.minimum({a}, 4.0))"),
    "exp2": (lambda a, b, p: rf.exp2(rf.minimum(a, 4.0)), "rf.exp2(rf.minimum({a}, 4.0))"),
    "log": (lambda a, b, p: rf.log(rf.abs(a) + 1.0), "rf.log(rf.abs({a}) + 1.0)"),
    "log2": (lambda a, b, p: rf.log2(rf.abs(a) + 1.0), "rf.log2(rf.abs({a}) + 1.0)"),
    # (away from 0, where sqrt turns an operand's absolute error e into about sqrt(e): an f16 log(|x| + 1),
    # rounded by numpy at each step and not by a kernel, then its sqrt, was 0.0473 for 0.0442, past the rule)
    "sqrt": (lambda a, b, p: rf.sqrt(rf.abs(a) + 0.0625), "rf.sqrt(rf.abs({a}) + 0.0625)"),
    "rsqrt": (lambda a, b, p: rf.rsqrt(rf.abs(a) + 1.0), "rf.rsqrt(rf.abs({a}) + 1.0)"),
    "square": (lambda a, b, p: a ** 2, "{a} ** 2"),
    "scale": (lambda a, b, p: a * p[0], "{a} * {p0}"),
    "scalar_left": (lambda a, b, p: p[0] - a, "{p0} - {a}"),
    "np_scalar_left": (lambda a, b, p: np.float32(p[0]) * a, "np.float32({p0}) * {a}"),
    "astype": (lambda a, b, p: a.astype(p[0]), "{a}.astype(rf.{p0.__name__})"),
    "add": (lambda a, b, p: a + b, "{a} + {b}"),
    "sub": (lambda a, b, p: a - b, "{a} - {b}"),
    "mul": (lambda a, b, p: a * b, "{a} * {b}"),
    "div": (lambda a, b, p: a / (rf.abs(b) + 1.0), "{a} / (rf.abs({b}) + 1.0)"),
    "maximum": (lambda a, b, p: rf.maximum(a, b), "rf.maximum({a}, {b})"),
    "minimum": (lambda a, b, p: rf.minimum(a, b), "rf.minimum({a}, {b})"),
    "where_max": (lambda a, b, p: rf.where(a > b, a, b), "rf.where({a} > {b}, {a}, {b})"),
    "mask": (lambda a, b, p: rf.where(b > 0.0, a, -rf.inf), "rf.where({b} > 0.0, {a}, -rf.inf)"),
    "logic": (lambda a, b, p: rf.where((b < -1.0) | ~(b < 1.0) & (b != 3.0), a, 0.0),
              "rf.where(({b} < -1.0) | ~({b} < 1.0) & ({b} != 3.0), {a}, 0.0)"),
    "sum": (lambda a, b, p: rf.sum(a, axis=p[0], keepdims=p[1]) * p[2],
            "rf.sum({a}, axis={p0}, keepdims={p1}) * {p2}"),
    "sum_method": (lambda a, b, p: a.sum(axis=p[0], keepdims=p[1]), "{a}.sum(axis={p0}, keepdims={p1})"),
    "max": (lambda a, b, p: rf.max(a, axis=p[0], keepdims=p[1]), "rf.max({a}, axis={p0}, keepdims={p1})"),
    "min": (lambda a, b, p: rf.min(a, axis=p[0], keepdims=p[1]), "rf.min({a}, axis={p0}, keepdims={p1})"),
    "matmul": (lambda a, b, p: (a @ b) * p[0], "({a} @ {b}) * {p0}"),
    "swapaxes": (lambda a, b, p: rf.swapaxes(a, p[0], p[1]), "rf.swapaxes({a}, {p0}, {p1})"),
    "transpose": (lambda a, b, p: rf.transpose(a, p[0]), "rf.transpose({a}, {p0})"),
    "T": (lambda a, b, p: a.T, "{a}.T"),
    "mT": (lambda a, b, p: a.mT, "{a}.mT"),
    "index": (lambda a, b, p: a[p[0]], "{a}[{key}]"),
}
ELEMENTWISE_UNARY = ("neg", "abs", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "square", "scale",
                     "scalar_left", "np_scalar_left", "astype")
ELEMENTWISE_BINARY = ("add", "sub", "mul", "div", "maximum", "minimum", "where_max")
CONDITIONAL = ("mask", "logic")  # `b` is only a condition: it must be bit-exact on both sides


@dataclass(frozen=True)
class Step:
    """``out = op(a, b, *params)``: one line of a random program."""

    out: str
    op: str
    a: str
    b: str | None = None
    params: tuple = ()

    def source(self) -> str:
        fmt = {f"p{n}": p for n, p in enumerate(self.params)}
        if self.op == "index":
            fmt["key"] = _key_text(self.params[0])
        return f"{self.out} = " + STEP_RULES[self.op][1].format(a=self.a, b=self.b, **fmt)

    def apply(self, env: dict) -> object:
        return STEP_RULES[self.op][0](env[self.a], env.get(self.b), self.params)


@dataclass(frozen=True)
class RandomProgram:
    """A random kernel body with the arrays to call it with.

    `body` runs the steps with ``redfuser`` ops (traced inside a kernel, numpy
    outside); `dtype`, `reduction_length` and `scale` are what `assert_close`
    needs to compare a kernel's outputs with the reference's.
    """

    input_names: tuple[str, ...]
    inputs: tuple[np.ndarray, ...] = field(repr=False)
    steps: tuple[Step, ...]
    outputs: tuple[str, ...]
    dtype: np.dtype
    reduction_length: int
    scale: float

    @property
    def body(self) -> Callable:
        """The kernel body: a function of ``len(inputs)`` positional arrays."""
        steps, names, outputs = self.steps, self.input_names, self.outputs

        def program(*args):
            env = dict(zip(names, args))
            for s in steps:
                env[s.out] = s.apply(env)
            return env[outputs[0]] if len(outputs) == 1 else tuple(env[o] for o in outputs)

        program.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])
        return program

    def __repr__(self) -> str:
        args = ", ".join(f"{n}: {a.dtype}[{','.join(map(str, a.shape))}]" for n, a in zip(self.input_names, self.inputs))
        lines = [f"def program({', '.join(self.input_names)}):    # {args}"]
        lines += [f"    {s.source()}" for s in self.steps] + [f"    return {', '.join(self.outputs)}"]
        return "\n".join(lines)

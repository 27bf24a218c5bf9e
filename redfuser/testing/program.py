"""A fuzzed program as data: parameters, a list of `Node`s, outputs, kernel options and the calls to make.

No source is generated and ``exec``-ed: `Program.body` runs the nodes through the
rules of `program_rules` (``redfuser`` ops), so the same callable traces into a
kernel and, on plain arrays, is the numpy reference. `Program.source` prints the
same body as Python for reproducers.

A program is called several times in a row on the *same* kernel object
(`Program.calls`): with other static scalar values (``2`` then ``2.0``, ``0.0``
then ``-0.0``), other data, or the same data in another layout (a broadcast or
negative-stride view), so what one call compiles and caches is checked against
what the next one needs.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable

from .program_data import ArrayData, scalar_source
from .program_rules import RULES, key_text, literal


@dataclass(frozen=True)
class Node:
    """``outs = op(args, params)``: one line of a program."""

    outs: tuple[str, ...]
    op: str
    args: tuple[str, ...]
    params: tuple = ()

    def source(self) -> str:
        rule = RULES[self.op]
        fmt = {f"p{n}": literal(p) for n, p in enumerate(self.params)}
        if self.op in ("index", "concatenate", "stack"):
            fmt["key"] = key_text(self.params[-1])
        names = dict(zip("abc", self.args))
        return f"{', '.join(self.outs)} = " + rule.template.format(**names, **fmt)

    def apply(self, env: dict) -> None:
        """Run the op on `env`'s values (tracers or arrays) and bind its outputs."""
        out = RULES[self.op].apply([env[a] for a in self.args], self.params)
        if len(self.outs) == 1:
            env[self.outs[0]] = out
        else:
            env.update(zip(self.outs, out))


@dataclass(frozen=True)
class Arg:
    """One argument of a call: an array (its values and layout) or a static scalar."""

    data: ArrayData | None = None
    layout: str = "c"
    scalar: object = None

    @property
    def is_array(self) -> bool:
        return self.data is not None

    def value(self) -> object:
        return self.data.present(self.layout) if self.data is not None else self.scalar


@dataclass(frozen=True)
class Program:
    """A kernel body (`params` -> `nodes` -> `outputs`), its options, and the calls made on one kernel object."""

    params: tuple[str, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[str, ...]
    calls: tuple[tuple[Arg, ...], ...]
    options: tuple[tuple[str, object], ...] = ()
    label: str = ""              # what the grammar drew (idioms), for the summary
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def body(self) -> Callable:
        """The kernel body: positional parameters, returns one value or a tuple."""
        nodes, names, outputs = self.nodes, self.params, self.outputs

        def program(*args):
            env = dict(zip(names, args))
            for node in nodes:
                node.apply(env)
            return env[outputs[0]] if len(outputs) == 1 else tuple(env[o] for o in outputs)

        program.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])
        return program

    def arguments(self, call: int) -> list[object]:
        """The values of call number `call`, as the kernel gets them."""
        return [a.value() for a in self.calls[call]]

    def source(self, name: str = "program") -> str:
        """The body as Python source."""
        lines = [f"def {name}({', '.join(self.params)}):"] + [f"    {n.source()}" for n in self.nodes]
        return "\n".join(lines + [f"    return {', '.join(self.outputs)}"])

    def describe(self) -> str:
        """One line: options, each call's arguments, the ops."""
        first = self.calls[0]
        args = ", ".join(f"{n}: {a.data.dtype}{list(a.data.shape)}" + (f" {a.layout}" if a.layout != "c" else "")
                         if a.is_array else f"{n}={scalar_source(a.scalar)}" for n, a in zip(self.params, first))
        ops = " ".join(n.op for n in self.nodes)
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options)
        more = f", {len(self.calls)} calls" if len(self.calls) > 1 else ""
        return f"({args}){more}{' [' + opts + ']' if opts else ''}: {ops}"

    def size(self) -> tuple[int, ...]:
        """A measure the shrinker makes smaller: nodes, calls, elements, options, non-literal data."""
        elements = sum(a.data.size() for call in self.calls for a in call if a.is_array)
        return (len(self.nodes), len(self.calls), elements, len(self.options), len(self.outputs))

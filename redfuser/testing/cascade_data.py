"""How a cascade's inputs are made: a numpy seed and a few steps, run here and printed as source.

`DataSpec.build` and `DataSpec.source` walk the same list of steps, so the
arrays a reproducer script builds are bit for bit the ones the fuzzer checked.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import redfuser as rf


@dataclass(frozen=True)
class DataSpec:
    """How the inputs are made: a numpy seed, then the same steps in `build` and in `source`."""

    seed: int
    dtype: str                                   # rf attribute: float32, float16, bfloat16
    profile: str
    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    data_scale: tuple[tuple[str, float, float], ...] = ()  # (input, std, offset); others are N(0, 1)
    keep: float = 1.0                            # mask: probability an element is kept (1: no mask)
    full_row: bool = False                       # mask: row 0 fully masked
    first_chunk: int = 0                         # mask: row 1 has its first elements masked
    specials: tuple[tuple[str, int, float], ...] = ()  # (input, flat position, value)

    def _steps(self) -> list[tuple[str, str, Callable]]:
        """(input, source line, apply(arrays, rng)) in order."""
        steps = []
        dt = getattr(rf, self.dtype)
        for name, shape in self.shapes:
            if name == "mask":
                steps.append((name, f"mask = rng.random({shape}) < {self.keep!r}",
                              lambda a, rng, s=shape: rng.random(s) < self.keep))
                n = shape[-1]
                if self.full_row:
                    steps.append((name, f"mask.reshape(-1, {n})[0] = False", lambda a, rng, n=n: _set(a["mask"], n, 0, n)))
                if self.first_chunk:
                    row, c = min(1, math.prod(shape[:-1]) - 1), self.first_chunk
                    steps.append((name, f"mask.reshape(-1, {n})[{row}, :{c}] = False",
                                  lambda a, rng, n=n, row=row, c=c: _set(a["mask"], n, row, c)))
                continue
            std, off = next(((a, b) for n, a, b in self.data_scale if n == name), (1.0, 0.0))
            steps.append((name, f"{name} = (rng.standard_normal({shape}) * {std!r} + {off!r}).astype(rf.{self.dtype})",
                          lambda a, rng, s=shape, std=std, off=off: (rng.standard_normal(s) * std + off).astype(dt)))
        for name, pos, value in self.specials:
            text = "np.nan" if math.isnan(value) else ("np.inf" if value > 0 else "-np.inf")
            steps.append((name, f"{name}.flat[{pos}] = {text}", lambda a, rng, n=name, p=pos, v=value: _put(a[n], p, v)))
        return steps

    def build(self) -> dict[str, np.ndarray]:
        """The input arrays, by name."""
        rng = np.random.default_rng(self.seed)
        arrays: dict[str, np.ndarray] = {}
        for name, _, apply in self._steps():
            out = apply(arrays, rng)
            if out is not None:
                arrays[name] = out
        return arrays

    def source(self) -> list[str]:
        """Python lines that build the same arrays (``np``, ``rf`` imported)."""
        return [f"rng = np.random.default_rng({self.seed})"] + [line for _, line, _ in self._steps()]


def _set(mask: np.ndarray, n: int, row: int, upto: int) -> None:
    mask.reshape(-1, n)[row, :upto] = False


def _put(a: np.ndarray, pos: int, value: float) -> None:
    a.flat[pos] = value


def _set(mask: np.ndarray, n: int, row: int, upto: int) -> None:
    mask.reshape(-1, n)[row, :upto] = False


def _put(a: np.ndarray, pos: int, value: float) -> None:
    a.flat[pos] = value

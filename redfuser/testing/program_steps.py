"""One random step of a fuzzed program, by kind: each function appends nodes to a `ProgramBuilder`.

Each takes the builder and an operand name and returns whether it added
something (the builder runs every node on numpy first and refuses what the
oracle could not judge, so a step tries a few alternatives).
"""
from __future__ import annotations

import numpy as np

from .program_grammar import ProgramBuilder, floats

CONSTANTS = (2.0, 0.5, -3.0, 1.0, 0.125, 448.0, -0.0, 3)
INT_CONSTANTS = (2, -3, 7, 1, 0)
CASTS = ("float32", "float16", "bfloat16", "float8_e4m3fn", "int32", "int64", "bool_")


def unary(b: ProgramBuilder, a: str) -> bool:
    d, v = b.draw, b.info(a)
    dt = v.dtype
    if dt == np.bool_:
        choices = [("not", ()), ("astype", ("int32",)), ("astype", ("float32",)), ("astype", ("float16",)),
                   ("abs", ()), ("floor", ()), ("isnan", ())] * 4 + [("square", ()), ("rint", ())]
        # (numpy's bool ** 2 is int8, a refusal: rare; its rint of bools is float16)
    elif dt.kind in "iu":
        choices = [("neg", ()), ("abs", ()), ("abs", ()), ("square", ()), ("astype", (d.pick(CASTS),)), ("recip", ()),
                   ("add_c", (d.pick(INT_CONSTANTS),)), ("mul_c", (d.pick(INT_CONSTANTS),)),
                   ("rsub_c", (d.pick(INT_CONSTANTS),)), ("div_c", (d.pick((2, 3.0, -4)),)),
                   ("gt_c", (d.pick(INT_CONSTANTS),)), ("eq_c", (0,)), ("mul_c", (2.5,)), ("exp_safe", ()),
                   ("astype", ("bool_",)), ("floor", ()), ("rint", ()), ("sign", ()), ("isfinite", ()),
                   ("clip_c", (d.pick(INT_CONSTANTS), d.pick(INT_CONSTANTS))),
                   ("floordiv_c", (d.pick((2, -3, 16, 0)),)), ("mod_c", (d.pick((2, -3, 16, 0)),))]
    else:
        choices = [("neg", ()), ("abs", ()), ("exp_safe", ()), ("exp2_safe", ()), ("log_safe", ()),
                   ("log2_safe", ()), ("sqrt_safe", ()), ("rsqrt_safe", ()), ("square", ()),
                   ("astype", (d.pick(CASTS),)), ("add_c", (d.pick(CONSTANTS),)), ("rsub_c", (d.pick(CONSTANTS),)),
                   ("mul_c", (d.pick(CONSTANTS),)), ("rmul_c", (np.float32(d.pick((0.5, 2.0, -1.0))),)),
                   ("div_c", (d.pick((2.0, 3.0, -0.5)),)), ("clip_c", (d.pick(CONSTANTS), d.pick(CONSTANTS))),
                   (d.pick(("tanh", "sin", "cos", "erf", "expm1_safe", "log1p_safe")), ())]
        if v.exact:
            choices += [("to_int", ()), ("gt_c", (d.pick(CONSTANTS),)), ("le_c", (0.0,)), ("eq_c", (0.0,)),
                        ("astype", ("bool_",)),
                        ("recip", ()), ("log", ()), ("sqrt", ()), ("exp", ()),
                        (d.pick(("floor", "ceil", "trunc", "rint", "round")), ()), ("sign", ()),
                        (d.pick(("isnan", "isinf", "isfinite")), ())]
    for _ in range(3):
        op, params = d.pick(choices)
        if params and params[0] == "bool_" and not v.exact:
            continue
        if params and params[0] in ("int32", "int64") and floats(b, a):
            op, params = "to_int", ()
            if not v.exact:
                continue
        if b.add(op, [a], params):
            return True
    return False


def operand(b: ProgramBuilder, a: str, dtype: str | None = None) -> str:
    """Another value that broadcasts with `a`: an existing one, or a new input."""
    d, shape = b.draw, b.shape(a)
    if d.chance(55):
        ok = [n for n in b.arrays() if _broadcasts(shape, b.shape(n)) and
              (dtype is None or str(b.dtype(n)) == dtype) and n != a]
        if ok:
            return d.pick(ok)
    if dtype is None:
        dtype = input_dtype(b.dtype(a)) if d.chance(70) else d.pick(("float32", "bool", "int32", "float16", "bfloat16"))
    return b.new_input(b.broadcastable(shape), dtype)


def input_dtype(dt: np.dtype) -> str:
    """An input dtype near `dt` (values can be float64 or int64; inputs cannot)."""
    name = "bool" if dt == np.bool_ else str(dt)
    return name if name in ("float32", "float16", "bfloat16", "int32", "bool") else \
        ("int32" if dt.kind in "iu" else "float32")


def _broadcasts(x: tuple[int, ...], y: tuple[int, ...]) -> bool:
    try:
        np.broadcast_shapes(x, y)
        return True
    except ValueError:
        return False


ARITH = ("add", "sub", "mul", "mul", "div", "div_safe", "maximum", "minimum", "logaddexp")
COMPARE = ("lt", "le", "gt", "ge", "eq", "ne")


def binary(b: ProgramBuilder, a: str) -> bool:
    d = b.draw
    for _ in range(3):
        kind = d.pick(("arith", "arith", "arith", "compare", "logic", "where"))
        if kind == "logic" or (kind == "where" and d.chance(50)):
            cond = a if b.dtype(a) == np.bool_ else _condition(b, a)
            if cond is None:
                continue
            if kind == "logic":
                other = operand(b, cond, "bool")
                if b.add(d.pick(("and", "or", "mul", "add", "maximum", "minimum")), [cond, other]):
                    return True
                continue
            x, y = operand(b, cond), operand(b, cond)
            if b.add("where", [cond, x, y]):
                return True
            continue
        if kind == "where":
            cond = _condition(b, a)
            if cond is not None and b.add("where_c", [cond, a], (d.pick((0.0, -np.inf, 1, -1.0)),)):
                return True
            continue
        other = operand(b, a)
        if kind == "compare":
            if b.info(a).exact and b.info(other).exact and b.add(d.pick(COMPARE), [a, other]):
                return True
            continue
        op = d.pick(ARITH)
        pair = [a, other] if d.chance(65) else [other, a]
        if b.add(op, pair):
            return True
    return False


def _condition(b: ProgramBuilder, a: str) -> str | None:
    """A bool value broadcasting with `a`: an existing one, a comparison of exact values, or a bool input."""
    d = b.draw
    bools = [n for n in b.arrays(lambda n: b.dtype(n) == np.bool_) if _broadcasts(b.shape(a), b.shape(n))]
    if bools and d.chance(50):
        return d.pick(bools)
    if b.info(a).exact and b.dtype(a) != np.bool_ and d.chance(60):
        return b.add(d.pick(("gt_c", "le_c")), [a], (d.pick((0.0, 0.5, -1.0)),)) if floats(b, a) else \
            b.add("gt_c", [a], (0,))
    return b.new_input(b.broadcastable(b.shape(a)), "bool")


def reduce(b: ProgramBuilder, a: str) -> bool:
    d, shape = b.draw, b.shape(a)
    ndim = len(shape)
    for _ in range(3):
        form = d.pick(("last", "last", "int", "tuple", "none") if ndim else ("none",))
        if form == "last":
            axis: object = -1
        elif form == "int":
            axis = d.integer(-ndim, ndim - 1)
        elif form == "tuple":
            dims = list(range(ndim))
            axis = tuple(x - ndim if d.chance(30) else x for x in dims[d.integer(0, ndim - 1):])
        else:
            axis = None
        op = d.pick(("sum", "sum", "max", "min", "sum_method", "mean", "var", "std", "prod"))
        params = (axis, d.chance(50)) + ((d.pick((0, 0, 1)),) if op in ("var", "std") else ())
        if b.add(op, [a], params):
            return True
    return False


def matmul(b: ProgramBuilder, a: str) -> bool:
    d, shape = b.draw, b.shape(a)
    if not shape:
        return False
    n = d.pick((1, 2, 3, 5, 8, 16))
    dtype = input_dtype(b.dtype(a)) if d.chance(70) else d.pick(("float32", "float16", "int32", "bool"))
    if d.chance(50):  # a @ new
        k = shape[-1]
        other = (k,) if d.chance(20) else b.broadcastable(shape[:-2]) + (k, n)
        if b.add("matmul", [a, b.new_input(other, dtype)]):
            return True
    else:
        k = shape[-2] if len(shape) > 1 else shape[0]
        other = (k,) if d.chance(20) else b.broadcastable(shape[:-2]) + (n, k)
        if b.add("matmul", [b.new_input(other, dtype), a]):
            return True
    return False


def topk(b: ProgramBuilder, a: str) -> bool:
    d, shape = b.draw, b.shape(a)
    if not shape or shape[-1] == 0 or b.dtype(a) in (np.bool_, np.int64):
        return False  # top-k of int64 is refused on compiled backends by design (a BackendError that says so)
    k = d.integer(1, min(shape[-1], 4))
    if not b.info(a).exact:
        return bool(b.add("topk_values", [a], (k,)))
    op = d.pick(("topk", "topk", "topk_values", "topk_indices"))
    made = b.add(op, [a], (k,), outs=2 if op == "topk" else 1)
    if made and op == "topk_indices" and d.chance(60):   # the values gathered back at the chosen indices
        b.add("take_along_axis", [a, made])
    return bool(made)


def view(b: ProgramBuilder, a: str) -> bool:
    d, shape = b.draw, b.shape(a)
    ndim = len(shape)
    op = d.pick(("swapaxes", "transpose", "T", "mT", "index", "index", "concatenate", "stack", "reshape"))
    if op == "reshape":
        return bool(b.add(op, [a], (_reshaped(b, shape),)))
    if op in ("swapaxes", "mT") and ndim < 2 or op == "concatenate" and ndim == 0:
        op = "index"
    if op in ("concatenate", "stack"):
        # joined with a slice of itself: along the axis for concatenate (any length), a same-shape view for stack
        axis = d.integer(-ndim, ndim - 1) if op == "concatenate" else d.integer(-ndim - 1, ndim)
        key = [slice(None)] * ndim
        if op == "concatenate":
            key[axis] = _slice(b, shape[axis])
        elif ndim:
            key[d.integer(0, ndim - 1)] = slice(None, None, -1)
        return bool(b.add(op, [a], (axis, tuple(key))))
    if op == "swapaxes":
        return bool(b.add(op, [a], (d.integer(-ndim, ndim - 1), d.integer(-ndim, ndim - 1))))
    if op == "transpose":
        perm = list(range(ndim))
        for i in range(ndim - 1, 0, -1):
            j = d.integer(0, i)
            perm[i], perm[j] = perm[j], perm[i]
        return bool(b.add(op, [a], (tuple(perm),)))
    if op == "index":
        return bool(b.add(op, [a], (index_key(b, shape),)))
    return bool(b.add(op, [a]))


def index_key(b: ProgramBuilder, shape: tuple[int, ...]) -> tuple:
    d = b.draw
    key: list[object] = []
    for size in shape:
        if d.chance(20):
            key.append(None)
        key.append(d.integer(-size, size - 1) if size and d.chance(25) else
                   _slice(b, size) if d.chance(30) else slice(None))
    if d.chance(40):
        key.append(None)
    if key and d.chance(30):
        key = [Ellipsis] + key[d.integer(0, len(key)):]
        if sum(1 for k in key if k is not None and k is not Ellipsis) > len(shape):
            key = [Ellipsis]
    return tuple(key)


def _reshaped(b: ProgramBuilder, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Another shape of as many elements: dims split and merged, length-1 dims added, sometimes one -1."""
    d = b.draw
    left, dims = int(np.prod(shape, dtype=np.int64)), []
    while left > 1 and len(dims) < 3:
        dims.append(d.pick([k for k in range(2, left + 1) if left % k == 0]))
        left //= dims[-1]
    if left != 1 or not dims:
        dims.append(left)
    if d.chance(30):
        dims.insert(d.integer(0, len(dims)), 1)
    if d.chance(30):
        dims[d.integer(0, len(dims) - 1)] = -1
    return tuple(dims)


def _slice(b: ProgramBuilder, size: int) -> slice:
    """A slice of a dim of `size`: numpy's bounds (negative, past the end, empty) and steps (negative too)."""
    d = b.draw
    bound = lambda: None if d.chance(35) else d.integer(-size - 1, size + 1)   # noqa: E731
    return slice(bound(), bound(), None if d.chance(40) else d.pick((1, 2, 3, -1, -2)))


def scalar(b: ProgramBuilder, a: str) -> bool:
    """Combine `a` with a static scalar argument (new or existing)."""
    d = b.draw
    s = d.pick(list(b.families)) if b.families and d.chance(50) else b.new_scalar()
    choices = [("mul", [a, s]), ("add", [a, s]), ("add", [s, a]), ("maximum", [a, s]), ("sub", [a, s])]
    if b.info(a).exact:
        choices += [("div", [a, s]), ("gt", [a, s]), ("eq", [a, s])]
        scaled = b.add(d.pick(("mul", "add")), [a, s])
        if scaled and b.info(scaled).exact and d.chance(50) and b.add("recip", [scaled]):
            return True  # 1 / (x * s): the sign of a zero (s = 0.0 or -0.0) shows as the sign of an infinity
    cond = _condition(b, a) if d.chance(20) else None
    if cond is not None:
        choices.append(("where", [cond, a, s]))
    for _ in range(3):
        op, args = d.pick(choices)
        if b.add(op, args):
            return True
    return False


def refusal(b: ProgramBuilder, a: str) -> bool:
    """A node numpy refuses: the kernel must refuse it with a user error, not an internal one."""
    d, shape = b.draw, b.shape(a)
    choice = d.integer(0, 4)
    if choice == 0 and b.dtype(a) == np.bool_:
        return b.refuse("sub", [a, a]) or b.refuse("neg", [a])
    if choice == 1 and shape:
        bad = shape[:-1] + (shape[-1] + 1,)
        return b.refuse("add", [a, b.new_input(bad, input_dtype(b.dtype(a)))])
    if choice == 2 and shape:
        return b.refuse("matmul", [a, b.new_input((shape[-1] + 1, 2), "float32")])
    if choice == 3 and shape:
        return b.refuse("topk", [a], (shape[-1] + 1,))
    return b.refuse("sum", [a], (len(shape) + 1, False))

"""The Tile IR by hand: types print like f32[64,128], the verifier rejects broken kernels,
the printer is deterministic, and the numpy interpreter follows the op semantics."""
from __future__ import annotations

import numpy as np
import pytest

from redfuser.ir import BinaryOp, Buffer, BufferType, ReduceOp, UnaryOp, VerifyError
from redfuser.ir.tile import nodes as t
from redfuser.ir import types as T
from redfuser.ir.tile.interpreter import run_tile_program
from redfuser.ir.tile.printer import format_tile_program
from redfuser.ir.tile.verifier import verify_tile_program

F32, I32, BOOL = T.float32, T.int32, T.bool_


def v(name, dtype, *shape):
    return t.Value(name, t.TileType(dtype, tuple(shape)))


def row_sum_program(rows: int, cols: int, block: int, chunk: int) -> t.TileProgram:
    """``out[i] = sum_j exp(x[i, j])`` by hand: rows tiled by `block`, columns in chunks of `chunk`."""
    x = Buffer("x", BufferType(F32, (rows, cols)))
    out = Buffer("out", BufferType(F32, (rows,)))
    pid, start, ar, rows_i, rows_in = v("pid", I32), v("start", I32), v("ar", I32, block), v("r", I32, block), \
        v("r_in", BOOL, block)
    k, acc, acc0, res = v("k", I32), v("acc", F32, block), v("acc0", F32, block), v("res", F32, block)
    car, cols_i, cols_in = v("car", I32, chunk), v("c", I32, chunk), v("c_in", BOOL, chunk)
    body = (
        t.Broadcast(v("kb", I32, chunk), k), t.Binary(cols_i, BinaryOp.ADD, v("kb", I32, chunk), car),
        t.Binary(cols_in, BinaryOp.LT, cols_i, v("ncols", I32, chunk)),
        t.ExpandDims(v("r2", I32, block, 1), v("roff", I32, block), 1),
        t.Broadcast(v("r3", I32, block, chunk), v("r2", I32, block, 1)),
        t.ExpandDims(v("c2", I32, 1, chunk), cols_i, 0),
        t.Broadcast(v("c3", I32, block, chunk), v("c2", I32, 1, chunk)),
        t.Binary(v("off", I32, block, chunk), BinaryOp.ADD, v("r3", I32, block, chunk), v("c3", I32, block, chunk)),
        t.ExpandDims(v("m1", BOOL, block, 1), rows_in, 1), t.Broadcast(v("m1b", BOOL, block, chunk), v("m1", BOOL, block, 1)),
        t.ExpandDims(v("m2", BOOL, 1, chunk), cols_in, 0), t.Broadcast(v("m2b", BOOL, block, chunk), v("m2", BOOL, 1, chunk)),
        t.Binary(v("mask", BOOL, block, chunk), BinaryOp.AND, v("m1b", BOOL, block, chunk), v("m2b", BOOL, block, chunk)),
        t.Load(v("xs", F32, block, chunk), x, v("off", I32, block, chunk), v("mask", BOOL, block, chunk), float("-inf")),
        t.Unary(v("e", F32, block, chunk), UnaryOp.EXP, v("xs", F32, block, chunk)),
        t.Reduce(v("part", F32, block), v("e", F32, block, chunk), 1, ReduceOp.SUM),
        t.Binary(v("acc1", F32, block), BinaryOp.ADD, acc, v("part", F32, block)),
    )
    ops = (
        t.ProgramId(pid, 0), t.Constant(v("B", I32), block), t.Binary(start, BinaryOp.MUL, pid, v("B", I32)),
        t.Arange(ar), t.Broadcast(v("startb", I32, block), start),
        t.Binary(rows_i, BinaryOp.ADD, v("startb", I32, block), ar),
        t.Constant(v("nrows", I32, block), rows), t.Binary(rows_in, BinaryOp.LT, rows_i, v("nrows", I32, block)),
        t.Constant(v("stride", I32, block), cols), t.Binary(v("roff", I32, block), BinaryOp.MUL, rows_i, v("stride", I32, block)),
        t.Arange(car), t.Constant(v("ncols", I32, chunk), cols), t.Constant(acc0, 0.0),
        t.For((res,), 0, cols, chunk, (acc0,), t.Region(k, (acc,), body, (v("acc1", F32, block),))),
        t.Store(out, rows_i, res, rows_in),
    )
    grid = (-(-rows // block),)
    kernel = t.TileKernel("row_sum", grid, (x, out), ops)
    return t.TileProgram("row_sum", (x,), (out,), (), (kernel,))


def test_types_print_like_shapes():
    assert str(t.TileType(F32, (64, 128))) == "f32[64,128]"
    assert str(t.TileType(I32)) == "i32"
    assert t.TileType(F32, (4, 8)).size == 32
    assert str(v("acc", F32, 16)) == "%acc"


@pytest.mark.parametrize("rows,cols,block,chunk", [(5, 37, 4, 8), (1, 1, 4, 8), (8, 16, 4, 8), (3, 7, 16, 16)])
def test_interpreter_runs_a_handwritten_kernel(rows, cols, block, chunk):
    p = verify_tile_program(row_sum_program(rows, cols, block, chunk))
    x = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    (out,) = run_tile_program(p, [x])
    np.testing.assert_allclose(out, np.exp(x).sum(-1), rtol=1e-5)


def test_printer_is_deterministic_and_readable():
    text = format_tile_program(row_sum_program(5, 37, 4, 8))
    assert text == str(row_sum_program(5, 37, 4, 8))
    assert text.splitlines()[0] == "tile program row_sum(x: f32[5,37]) -> (out: f32[5])"
    assert "  kernel row_sum grid (2,) params (x, out):" in text
    assert "%res: f32[4] = for %k: i32 = 0 to 37 step 8 iter (%acc = %acc0) {" in text
    assert "%xs: f32[4,8] = load x[%off] mask %mask other -inf" in text
    assert "%part: f32[4] = reduce sum %e axis 1" in text
    assert "      yield %acc1" in text
    assert "store out[%r] = %res mask %r_in" in text


def _with_op(p: t.TileProgram, index: int, op) -> t.TileProgram:
    k = p.kernels[0]
    body = list(k.body)
    body[index] = op
    return t.TileProgram(p.name, p.inputs, p.outputs, p.scratch, (t.TileKernel(k.name, k.grid, k.params, tuple(body)),))


@pytest.mark.parametrize("index,op,message", [
    (2, t.Binary(v("start", I32), BinaryOp.MUL, v("pid", I32), v("nope", I32)), "used before it is defined"),
    (5, t.Binary(v("r", I32, 4), BinaryOp.ADD, v("startb", I32, 4), v("B", I32)), "share one shape"),
    (7, t.Binary(v("r_in", I32, 4), BinaryOp.LT, v("r", I32, 4), v("nrows", I32, 4)), "wrong dtype"),
    (0, t.ProgramId(v("pid", I32), 1), "outside grid"),
    (4, t.Broadcast(v("startb", I32, 4), v("ar", I32, 4)), "broadcast changes"),
    (3, t.Arange(v("ar", F32, 4)), "1-d integer"),
    (14, t.Store(Buffer("x", BufferType(F32, (5, 37))), v("r", I32, 4), v("res", F32, 4), None), "stores into input"),
])
def test_verifier_rejects_broken_kernels(index, op, message):
    p = row_sum_program(5, 37, 4, 8)
    if index == 4:
        op = t.Broadcast(v("startb", I32, 4), v("start", F32))
    with pytest.raises(VerifyError, match=message):
        verify_tile_program(_with_op(p, index, op), pass_name="handmade")


def test_verifier_rejects_low_precision_arithmetic_and_bad_loops():
    h = v("h", T.float16, 4)
    bad = t.TileKernel("k", (1,), (), (t.Constant(h, 1.0), t.Unary(v("e", T.float16, 4), UnaryOp.EXP, h)))
    with pytest.raises(VerifyError, match="arithmetic in f16"):
        verify_tile_program(t.TileProgram("p", (), (), (), (bad,)))
    a0, a = v("a0", F32, 4), v("a", F32, 4)
    loop = t.For((v("r", F32, 8),), 0, 4, 1, (a0,), t.Region(v("i", I32), (a,), (), (a,)))
    bad = t.TileKernel("k", (1,), (), (t.Constant(a0, 0.0), loop))
    with pytest.raises(VerifyError, match="changes type"):
        verify_tile_program(t.TileProgram("p", (), (), (), (bad,)))


def _marked(text: str) -> list[str]:
    """The lines of an error's excerpt that carry the ``>>`` marker."""
    return [line.strip() for line in text.splitlines() if line.strip().startswith(">>")]


def test_verifier_error_shows_the_kernel_around_the_bad_op():
    bad = t.Binary(v("r_in", I32, 4), BinaryOp.LT, v("r", I32, 4), v("nrows", I32, 4))
    with pytest.raises(VerifyError) as info:
        verify_tile_program(_with_op(row_sum_program(5, 37, 4, 8), 7, bad), pass_name="handmade")
    text = str(info.value)
    assert text.splitlines()[0] == "internal error after pass handmade: < gives the wrong dtype"
    assert _marked(text) == [">>  9 |   %r_in: i32[4] = %r < %nrows"]
    for neighbour in ("%startb: i32[4] = broadcast %start", "%nrows: i32[4] = const 5",       # three before
                      "%stride: i32[4] = const 37", "%car: i32[8] = arange"):                  # and after
        assert neighbour in text
    assert "%pid: i32 = program_id 0" not in text and "%ncols" not in text


def test_verifier_error_marks_an_op_inside_a_loop():
    h = v("h", T.float16, 4)
    body = (t.Constant(h, 1.0), t.Unary(v("e", T.float16, 4), UnaryOp.EXP, h), t.Constant(v("z", F32, 4), 0.0))
    loop = t.For((), 0, 4, 1, (), t.Region(v("i", I32), (), body, ()))
    kernel = t.TileKernel("k", (1,), (), (t.Constant(v("a", F32, 4), 0.0), loop))
    with pytest.raises(VerifyError) as info:
        verify_tile_program(t.TileProgram("p", (), (), (), (kernel,)), pass_name="handmade")
    text = str(info.value)
    assert _marked(text) == [">> 5 |     %e: f16[4] = exp %h"]
    assert "for %i: i32 = 0 to 4 step 1 {" in text and "%z: f32[4] = const 0.0" in text and "yield" in text


def test_dot_and_permute_semantics():
    a, b, c = v("a", F32, 3, 5), v("b", F32, 4, 5), v("c", F32, 3, 4)
    x = Buffer("x", BufferType(F32, (3, 5)))
    y = Buffer("y", BufferType(F32, (4, 5)))
    out = Buffer("out", BufferType(F32, (3, 4)))
    ops = [
        t.Arange(v("i3", I32, 3)), t.Arange(v("i4", I32, 4)), t.Arange(v("i5", I32, 5)),
        t.Constant(v("five", I32, 3), 5), t.Binary(v("r", I32, 3), BinaryOp.MUL, v("i3", I32, 3), v("five", I32, 3)),
        t.ExpandDims(v("r2", I32, 3, 1), v("r", I32, 3), 1), t.Broadcast(v("r3", I32, 3, 5), v("r2", I32, 3, 1)),
        t.ExpandDims(v("c2", I32, 1, 5), v("i5", I32, 5), 0), t.Broadcast(v("c3", I32, 3, 5), v("c2", I32, 1, 5)),
        t.Binary(v("xo", I32, 3, 5), BinaryOp.ADD, v("r3", I32, 3, 5), v("c3", I32, 3, 5)),
        t.Load(a, x, v("xo", I32, 3, 5), None, 0.0),
        t.Constant(v("yo", I32, 4, 5), 0), t.Load(b, y, v("yo", I32, 4, 5), None, 0.0),
        t.Permute(v("bt", F32, 5, 4), b, (1, 0)), t.Constant(c, 1.0),
        t.Dot(v("d", F32, 3, 4), a, v("bt", F32, 5, 4), c),
        t.Constant(v("four", I32, 3), 4), t.Binary(v("o1", I32, 3), BinaryOp.MUL, v("i3", I32, 3), v("four", I32, 3)),
        t.ExpandDims(v("o2", I32, 3, 1), v("o1", I32, 3), 1), t.Broadcast(v("o3", I32, 3, 4), v("o2", I32, 3, 1)),
        t.ExpandDims(v("o4", I32, 1, 4), v("i4", I32, 4), 0), t.Broadcast(v("o5", I32, 3, 4), v("o4", I32, 1, 4)),
        t.Binary(v("oo", I32, 3, 4), BinaryOp.ADD, v("o3", I32, 3, 4), v("o5", I32, 3, 4)),
        t.Store(out, v("oo", I32, 3, 4), v("d", F32, 3, 4), None),
    ]
    k = t.TileKernel("k", (), (x, y, out), tuple(ops))
    p = verify_tile_program(t.TileProgram("p", (x, y), (out,), (), (k,)))
    xs = np.arange(15, dtype=np.float32).reshape(3, 5)
    ys = np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32)
    (res,) = run_tile_program(p, [xs, ys])
    np.testing.assert_allclose(res, np.broadcast_to(1.0 + xs.sum(1, keepdims=True) * ys[0, 0], (3, 4)), rtol=1e-6)


def test_interpreter_catches_unmasked_out_of_bounds():
    x = Buffer("x", BufferType(F32, (4,)))
    out = Buffer("out", BufferType(F32, (8,)))
    ar = v("ar", I32, 8)
    k = t.TileKernel("k", (1,), (x, out), (t.Arange(ar), t.Load(v("l", F32, 8), x, ar, None, 0.0),
                                            t.Store(out, ar, v("l", F32, 8), None)))
    p = verify_tile_program(t.TileProgram("p", (x,), (out,), (), (k,)))
    with pytest.raises(Exception, match="outside"):
        run_tile_program(p, [np.zeros(4, np.float32)])

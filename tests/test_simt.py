"""The SIMT IR: node helpers, the deterministic printer, the verifier's checks and static value ranges."""
from __future__ import annotations

import pytest

import simt_kernels as K
from redfuser.ir.errors import VerifyError
from redfuser.ir.semantics import BinaryOp, UnaryOp
from redfuser.ir.simt.nodes import (
    Barrier, BlockIdx, Branch, Const, For, If, IntOp, LoadShared, MmaShape, Reg, RegType, Region, ShuffleKind,
    SimtKernel, StoreShared, ThreadIdx, defs, uses, walk_stmts,
)
from redfuser.ir.simt.builder import SimtBuilder
from redfuser.ir.simt.ranges import Range, transfer
from redfuser.ir.simt.verifier import verify_simt_kernel
from redfuser.ir.types import bfloat16, bool_, float16, float32, float64, int32, int64

ALL_SAMPLES = [K.elementwise, lambda: K.elementwise(index64=True), K.vector_scale, K.block_sum, K.softmax_stats,
               K.mma_gemm, lambda: K.mma_gemm(MmaShape.M16N8K32_E4M3), lambda: K.all_ops()[0], K.fp8_roundtrip,
               K.branchy]


def test_types_print_and_mma_fragment_types():
    assert str(RegType(float32)) == "f32" and str(RegType(float16, 8)) == "<8 x f16>"
    assert RegType(float16, 8).nbytes == 16
    f16 = MmaShape.M16N8K16_F16
    assert (str(f16.a_type), str(f16.b_type), str(f16.c_type)) == ("<8 x f16>", "<4 x f16>", "<4 x f32>")
    e4m3 = MmaShape.M16N8K32_E4M3
    assert (e4m3.k, str(e4m3.a_type), str(e4m3.b_type)) == (32, "<16 x f8e4m3>", "<8 x f8e4m3>")


SCALE_TEXT = """\
simt kernel scale(x: f32[100], out: f32[100], %n: i32) grid (2,) block 64 (2 warps)
  shared stage: f32[64]
  %bidx: i32 = block_idx x
  %c: i32 = const 64
  %mul: i32 = %bidx * %c
  %tid: i32 = thread_idx
  %add: i32 = %mul + %tid
  %lt: bool = %add < %n
  %x: f32 = load.global x[%add] mask %lt other 0.0
  store.shared stage[%tid] = %x
  barrier
  %acc: f32 = for %k: i32 = 0 to 2 step 1 iter (%acc_run = %x) {
    %c_1: f32 = const 2.0
    %mul_1: f32 = %acc_run * %c_1
    yield %mul_1
  }
  %if: f32 = if %lt {
    %stage: f32 = load.shared stage[%tid]
    yield %stage
  } else {
    yield %acc
  }
  store.global out[%add] = %if mask %lt"""


def _scale() -> SimtKernel:
    b = SimtBuilder("scale", warps=2, grid=(2,))
    x, out = b.buffer("x", float32, (100,)), b.buffer("out", float32, (100,))
    n = b.scalar_param("n", int32)
    stage = b.shared("stage", float32, (64,))
    bid = b.block_idx()
    base = b.mul(bid, b.const(64, int32))
    tid = b.thread_idx()
    i = b.add(base, tid)
    inside = b.lt(i, n)
    v = b.load_global(x, i, mask=inside, other=0.0)
    b.store_shared(stage, tid, v)
    b.barrier()
    (acc,) = b.for_(0, 2, 1, [v], lambda k, run: [b.mul(run, b.const(2.0, float32))], names=["acc"], iv_name="k")
    (picked,) = b.if_(inside, lambda: [b.load_shared(stage, tid)], lambda: [acc])
    b.store_global(out, i, picked, mask=inside)
    return b.build()


def test_printer_golden_text_is_deterministic():
    kernel = _scale()
    assert str(kernel) == SCALE_TEXT
    assert str(_scale()) == str(kernel) and _scale() == kernel and hash(_scale()) == hash(kernel)


@pytest.mark.parametrize("make", ALL_SAMPLES)
def test_sample_kernels_verify_and_print_stably(make):
    kernel = make()
    assert verify_simt_kernel(kernel) is kernel
    assert str(make()) == str(kernel)
    for s in walk_stmts(kernel.body):   # every register used is defined exactly once somewhere
        assert all(isinstance(r, Reg) for r in uses(s) + defs(s))


def test_defs_uses_walk():
    kernel = K.block_sum()
    loops = [s for s in walk_stmts(kernel.body) if isinstance(s, For)]
    ifs = [s for s in walk_stmts(kernel.body) if isinstance(s, If)]
    assert len(loops) == 1 and len(ifs) == 1
    assert uses(loops[0])[0].name == "tid" and len(defs(loops[0])) == 1
    assert any(isinstance(s, Barrier) for s in kernel.body)
    assert kernel.threads == 128 and kernel.shared_bytes == 16 and [b.name for b in kernel.buffers] == ["x", "out"]


# --- the verifier -------------------------------------------------------------------------------------

def _kernel(body, *, warps=1, grid=(1,), params=(), shared=()) -> SimtKernel:
    return SimtKernel("bad", tuple(params), warps, grid, tuple(shared), tuple(body))


def _bad(build) -> SimtKernel:
    b = SimtBuilder("bad", warps=1, grid=(1,))
    build(b)
    return b.build(verify=False)


R = lambda name, dtype=int32, n=1: Reg(name, RegType(dtype, n))  # noqa: E731


BAD_KERNELS = {
    "used before it is defined": lambda: _kernel([LoadShared(R("v", float32), _alloc(), R("nowhere"))],
                                                 shared=[_alloc()]),
    "defined twice": lambda: _kernel([ThreadIdx(R("a")), ThreadIdx(R("a"))]),
    "differ": lambda: _bad(lambda b: b.binary(BinaryOp.ADD, b.thread_idx(), b.const(1, int64))),
    "arithmetic in f16": lambda: _bad(lambda b: b.unary(UnaryOp.NEG, b.const(1.0, float16))),
    "f32 only": lambda: _bad(lambda b: b.unary(UnaryOp.EXP, b.const(1.0, float64))),
    "integer division": lambda: _bad(lambda b: b.binary(BinaryOp.DIV, b.thread_idx(), b.thread_idx())),
    "is not a i32": lambda: _bad(lambda b: b.const(1.5, int32)),
    "A fragment": lambda: _bad(lambda b: b.mma(MmaShape.M16N8K16_F16, b.const(0.0, bfloat16, 8),
                                               b.const(0.0, float16, 4), b.const(0.0, float32, 4))),
    "only f32 and i32": lambda: _bad(lambda b: b.shuffle(ShuffleKind.BFLY, b.const(1, int64), 1)),
    "power of two": lambda: _bad(lambda b: b.shuffle(ShuffleKind.BFLY, b.thread_idx(), 1, width=12)),
    "at most 16 bytes": lambda: _bad(lambda b: b.load_global(b.buffer("x", float32, (64,)), b.thread_idx(),
                                                             length=8)),
    "index it with i64": lambda: _bad(lambda b: b.load_global(b.buffer("x", float32, (2**31 + 8,)),
                                                              b.thread_idx())),
    "outside the 16 of s": lambda: _bad(lambda b: b.load_shared(b.shared("s", float32, (16,)), b.thread_idx())),
    "bytes of static shared memory": lambda: _bad(lambda b: b.shared("big", float32, (13000,))),
    "warps per block": lambda: _kernel([], warps=33),
    "grid": lambda: _kernel([], grid=(0,)),
    "block_idx axis 1": lambda: _kernel([BlockIdx(R("b"), 1)]),
    "changes type": lambda: _kernel([Const(R("z", float32), 0.0), For((R("o", int32),), 0, 4, 1, (R("z", float32),),
                                                                      Region(R("iv"), (R("a", float32),), (),
                                                                             (R("a", float32),)))]),
    "do not match the results": lambda: _kernel([Const(R("c", bool_), True), Const(R("v"), 1),
                                                 If((R("r"),), R("c", bool_), Branch((), (R("v"),)), Branch(()))]),
    "not visible": lambda: _kernel([Const(R("c", bool_), True),
                                    If((R("r"),), R("c", bool_), Branch((Const(R("inner"), 1),), (R("inner"),)),
                                       Branch((), (R("inner"),)))]),
    "do not add up": lambda: _bad(lambda b: b.emit(_pack_wrong(b))),
    "extract": lambda: _bad(lambda b: b.extract(b.const(0.0, float32, 4), 3, 2)),
    "ldmatrix reads 16-bit elements": lambda: _bad(lambda b: b.ldmatrix(b.shared("s", float32, (64,)),
                                                                        b.const(0, int32), 4)),
    "ldmatrix of 8 matrices": lambda: _bad(lambda b: b.ldmatrix(b.shared("s", float16, (64,)), b.const(0, int32), 8)),
    "rows reach elements 64..71": lambda: _bad(lambda b: b.ldmatrix(b.shared("s", float16, (64,)),
                                                                    b.const(64, int32), 1, trans=True)),
}


def _alloc():
    from redfuser.ir.simt.nodes import SharedAlloc
    from redfuser.ir.types import BufferType
    return SharedAlloc("s", BufferType(float32, (32,)))


def _pack_wrong(b: SimtBuilder):
    from redfuser.ir.simt.nodes import Pack
    part = b.const(0.0, float32)
    return Pack(R("p", float32, 4), (part, part))


@pytest.mark.parametrize("expected", sorted(BAD_KERNELS))
def test_verifier_rejects(expected):
    with pytest.raises(VerifyError, match=expected.replace("*", r"\*")):
        verify_simt_kernel(BAD_KERNELS[expected](), "test")


def test_verifier_error_names_kernel_pass_and_statement():
    kernel = _bad(lambda b: b.shuffle(ShuffleKind.BFLY, b.const(1, int64), 1))
    with pytest.raises(VerifyError) as info:
        verify_simt_kernel(kernel, "lower_to_simt")
    text = str(info.value)
    assert "after pass lower_to_simt" in text and "kernel bad" in text and "shfl.bfly %c, 1 width 32" in text


def test_verifier_error_shows_the_kernel_around_the_bad_statement():
    def build(b: SimtBuilder) -> None:
        one = b.const(1.0, float32)
        b.barrier()
        b.for_(0, 4, 1, [], lambda iv: (b.barrier(), b.shuffle(ShuffleKind.BFLY, b.const(1, int64), 1),
                                        b.barrier(), b.add(one, one)) and None)
        b.barrier()

    with pytest.raises(VerifyError) as info:
        verify_simt_kernel(_bad(build), "lower_to_simt")
    lines = str(info.value).splitlines()
    assert lines[0] == "internal error after pass lower_to_simt: kernel bad: shuffle of i64: only f32 and i32 scalars"
    marked = [i for i, line in enumerate(lines) if line.strip().startswith(">>")]
    assert len(marked) == 1 and lines[marked[0]].endswith("|     %shfl_bfly: i64 = shfl.bfly %c_1, 1 width 32")
    # three printed lines either side of the bad one, the repeated barriers told apart by position
    assert [line.split("|", 1)[1] for line in lines[marked[0] - 3: marked[0] + 4]] == [
        "   for %iv: i32 = 0 to 4 step 1 {", "     barrier", "     %c_1: i64 = const 1",
        "     %shfl_bfly: i64 = shfl.bfly %c_1, 1 width 32", "     barrier", "     %add: f32 = %c + %c", "   }"]


def test_static_shared_bounds_only_where_certain():
    def kernel(guard: str) -> SimtKernel:
        b = SimtBuilder("bounds", warps=2, grid=(1,))
        s = b.shared("s", float32, (32,))
        tid = b.thread_idx()
        if guard == "mask":
            b.store_shared(s, tid, b.const(0.0, float32), mask=b.lt(tid, b.const(32, int32)))
        elif guard == "if":
            b.if_(b.lt(tid, b.const(32, int32)), lambda: b.store_shared(s, tid, b.const(0.0, float32)))
        elif guard == "lane":
            b.store_shared(s, b.lane_id(), b.const(0.0, float32))
        else:
            b.store_shared(s, b.add(tid, b.const(-64, int32)), b.const(0.0, float32))
        return b.build(verify=False)

    for ok in ("mask", "if", "lane"):
        verify_simt_kernel(kernel(ok))
    with pytest.raises(VerifyError, match=r"reaches elements -64\.\.-1"):
        verify_simt_kernel(kernel("negative"))
    # Vectors count their length: lane * 4 + 4 elements of 128 is fine, of 127 it is not.
    for size, fine in ((128, True), (127, False)):
        b = SimtBuilder("vec", warps=1, grid=(1,))
        s = b.shared("s", float32, (size,))
        b.store_shared(s, b.mul(b.lane_id(), b.const(4, int32)), b.const(0.0, float32, 4))
        if fine:
            b.build()
        else:
            with pytest.raises(VerifyError, match="reaches elements 0..127"):
                b.build()


def test_value_ranges():
    kernel = SimtKernel("r", (), 4, (3,), (), ())
    ranges: dict[str, Range] = {}
    stmts = _range_stmts()
    for s in stmts:
        transfer(s, ranges, kernel)
    assert ranges["tid"] == Range(0, 127, True)
    assert ranges["x4"] == Range(0, 508, True)
    assert ranges["plus"] == Range(3, 511, True)
    assert ranges["shr"] == Range(0, 15, True)
    assert ranges["sum"] == Range(0, 254, False)       # two registers: only a bound
    assert ranges["masked"] == Range(0, 31, False)      # ends reached only if every value is: a bound
    assert ranges["rem"] == Range(0, 9, False)
    assert ranges["bid"] == Range(0, 2, True)
    assert "big" not in ranges                          # would wrap in i32: no range


def _range_stmts():
    from redfuser.ir.simt.nodes import Binary, IntBinary
    tid, c4, c3, c5, c31, c10 = R("tid"), R("c4"), R("c3"), R("c5"), R("c31"), R("c10")
    cbig = R("cbig")
    return [ThreadIdx(tid), Const(c4, 4), Const(c3, 3), Const(c5, 5), Const(c31, 31), Const(c10, 10),
            Const(cbig, 2**30), BlockIdx(R("bid"), 0),
            Binary(R("x4"), BinaryOp.MUL, tid, c4), Binary(R("plus"), BinaryOp.ADD, R("x4"), c3),
            IntBinary(R("shr"), IntOp.SHR, tid, R("c3")), Binary(R("sum"), BinaryOp.ADD, tid, tid),
            IntBinary(R("masked"), IntOp.AND, tid, c31), IntBinary(R("rem"), IntOp.REM, tid, c10),
            Binary(R("big"), BinaryOp.MUL, tid, cbig)]


def test_stores_and_loads_are_distinct_statements():
    kernel = K.block_sum()
    stores = [s for s in walk_stmts(kernel.body) if isinstance(s, StoreShared)]
    loads = [s for s in walk_stmts(kernel.body) if isinstance(s, LoadShared)]
    assert len(stores) == 1 and len(loads) == 1 and stores[0].alloc == loads[0].alloc


def test_drop_unused_removes_dead_chains_in_one_call_and_keeps_effects():
    """A dead statement's own reads go with it (a chain ``a -> b -> unread`` in one call, also inside a loop
    body); stores, barriers, loops, carried values and what they read stay; a clean kernel comes back as
    the same object."""
    from redfuser.codegen.simt.cleanup import drop_unused
    from redfuser.ir.simt.nodes import walk_stmts

    b = SimtBuilder("dead", warps=1, grid=(1,))
    out = b.buffer("out", float32, (32,))
    tid = b.thread_idx()
    a = b.add(tid, b.const(1, int32))
    b.mul(a, b.const(2, int32))                                      # reads a; nobody reads it
    kept = b.cast(tid, float32)

    def body(i, acc):
        wasted = b.unary(UnaryOp.EXP, b.cast(i, float32))             # dead inside the loop
        b.add(wasted, acc)
        return [b.add(acc, kept)]                                     # the carried value stays

    (total,) = b.for_(0, 4, 1, [b.const(0.0, float32)], body)
    b.barrier()
    b.store_global(out, tid, total)
    kernel = b.build()
    cleaned = drop_unused(kernel)
    before, after = list(walk_stmts(kernel.body)), list(walk_stmts(cleaned.body))
    assert len(before) - len(after) == 7   # a, the product, their two constants; the cast, exp and add in the loop
    names = {getattr(s, "out", None) and s.out.name for s in after}
    assert a.name not in names and kept.name in names
    assert [type(s).__name__ for s in after if type(s).__name__ in ("For", "Barrier", "StoreGlobal")] == \
        ["For", "Barrier", "StoreGlobal"]
    verify_simt_kernel(cleaned)
    assert drop_unused(cleaned) is cleaned

"""The wgmma fragment maps, descriptors and swizzles (ir/simt/wgmma_fragments.py) against an independent
transcription: CUTLASS's published CuTe layouts (``CLayout_64xN`` of ``mma_traits_sm90_gmma.hpp``, the
``Swizzle<B, M, S>`` functors of ``swizzle.hpp``), evaluated here by a small layout-algebra evaluator that
shares no code with the module, and the PTX ISA's descriptor bit table."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from redfuser.ir.errors import InternalError
from redfuser.ir.simt.wgmma_fragments import (MatrixDescriptor, Swizzle, accumulator, k_major_offset, register_a,
                                              swizzle)


def _flatten(shape, stride):
    if isinstance(shape, tuple):
        out = []
        for sh, sd in zip(shape, stride):
            out += _flatten(sh, sd)
        return out
    return [(shape, stride)]


def cute_layout(shape, stride, coord: int) -> int:
    """A CuTe layout applied to a 1-d coordinate: split colexicographically (first mode fastest) over the
    flattened shape, then the inner product with the strides."""
    offset = 0
    for extent, step in _flatten(shape, stride):
        coord, c = divmod(coord, extent)
        offset += c * step
    return offset


def clayout_64xn(thread: int, value: int, n: int) -> tuple[int, int]:
    """CUTLASS's ``CLayout_64xN`` (thread, value) -> (m, n) of a column-major 64 x N tile:
    Shape ((4, 8, 4), (2, 2, N/8)), Stride ((128, 1, 16), (64, 8, 512))."""
    t = cute_layout((4, 8, 4), (128, 1, 16), thread)
    v = cute_layout((2, 2, n // 8), (64, 8, 512), value)
    idx = t + v
    return idx % 64, idx // 64


@pytest.mark.parametrize("n", list(range(8, 257, 8)))
def test_accumulator_is_cutlass_clayout_and_a_bijection(n):
    seen = set()
    for thread in range(128):
        for value in range(n // 2):
            got = accumulator(thread, value, n)
            assert got == clayout_64xn(thread, value, n)
            seen.add(got)
    assert seen == {(r, c) for r in range(64) for c in range(n)}


def test_register_a_is_the_m64k16_fragment_two_values_per_register():
    seen = []
    for thread in range(128):
        for reg in range(4):
            pair = register_a(thread, reg)
            assert pair == [clayout_64xn(thread, 2 * reg, 16), clayout_64xn(thread, 2 * reg + 1, 16)]
            assert pair[1] == (pair[0][0], pair[0][1] + 1)   # a packed pair is two neighbours of one row
            seen += pair
    assert sorted(seen) == [(r, c) for r in range(64) for c in range(16)]


def test_each_warp_holds_its_own_16_rows():
    for thread in range(128):
        rows = {accumulator(thread, i, 64)[0] for i in range(32)}
        assert rows <= set(range(16 * (thread // 32), 16 * (thread // 32) + 16))


@pytest.mark.parametrize("n,thread,value", [(4, 0, 0), (264, 0, 0), (12, 0, 0), (64, 128, 0), (64, 0, 32)])
def test_outside_the_fragment_is_an_internal_error(n, thread, value):
    with pytest.raises(InternalError):
        accumulator(thread, value, n)


def cute_swizzle(bits: int, base: int, shift: int, offset: int) -> int:
    """CuTe's ``Swizzle<B, M, S>``: XOR the B bits at [M, M+B) with the B bits at [M+S, M+S+B)."""
    mask = ((1 << bits) - 1) << (base + shift)
    return offset ^ ((offset & mask) >> shift)


CUTE = {Swizzle.B128: (3, 4, 3), Swizzle.B64: (2, 4, 3), Swizzle.B32: (1, 4, 3)}


@given(offset=st.integers(0, 1 << 16), mode=st.sampled_from(list(CUTE)))
def test_swizzle_is_cutes_and_an_involution(offset, mode):
    assert swizzle(offset, mode) == cute_swizzle(*CUTE[mode], offset)
    assert swizzle(swizzle(offset, mode), mode) == offset
    assert swizzle(offset, Swizzle.NONE) == offset


def test_128_byte_swizzle_moves_chunk_c_of_row_r_to_c_xor_r():
    for row in range(16):
        for chunk in range(8):
            assert swizzle(row * 128 + chunk * 16 + 5, Swizzle.B128) == row * 128 + (chunk ^ (row % 8)) * 16 + 5


def test_k_major_tile_of_f16_is_a_permutation_of_its_1024_byte_atoms():
    offsets = {k_major_offset(row, k, 2) for row in range(64) for k in range(64)}
    assert offsets == set(range(0, 64 * 128, 2))
    with pytest.raises(InternalError):
        k_major_offset(0, 64, 2)


@given(start=st.integers(0, (1 << 14) - 1), leading=st.integers(0, (1 << 14) - 1),
       stride=st.integers(0, (1 << 14) - 1), base=st.integers(0, 7), mode=st.sampled_from(list(Swizzle)))
def test_descriptor_fields_sit_where_the_ptx_isa_puts_them(start, leading, stride, base, mode):
    d = MatrixDescriptor(start * 16, leading * 16, stride * 16, base, mode)
    bits = d.encode()
    assert bits & 0x3FFF == start and (bits >> 16) & 0x3FFF == leading and (bits >> 32) & 0x3FFF == stride
    assert (bits >> 49) & 7 == base and bits >> 62 == mode.value
    assert bits & ~((0x3FFF) | (0x3FFF << 16) | (0x3FFF << 32) | (7 << 49) | (3 << 62)) == 0   # reserved bits 0
    assert MatrixDescriptor.decode(bits) == d


def test_descriptor_start_keeps_the_low_18_address_bits_and_rejects_misaligned_fields():
    assert MatrixDescriptor(0x40000 + 0x1230, 16, 1024).encode() & 0x3FFF == 0x1230 >> 4
    for bad in (MatrixDescriptor(8, 16, 1024), MatrixDescriptor(0, 16 << 14, 1024), MatrixDescriptor(0, 16, 24),
                MatrixDescriptor(0, 16, 1024, base=8)):
        with pytest.raises(InternalError):
            bad.encode()


@pytest.mark.parametrize("mode,itemsize,n,k", [(mode, 2, n, k) for mode in CUTE for n, k in ((64, 16), (128, 32), (256, 16),
                                                                                          (32, 16))
                                                 if n * 2 % mode.row_bytes == 0])     # N: whole swizzle rows
def test_an_mn_major_tile_is_cutes_canonical_mn_major_layout(mode, itemsize, n, k):
    """The simulator's N-major B tile (`tile_elements` with ``mn_major``) against CuTe's canonical MN-major
    GMMA layouts, ``Swizzle<B,4,3> o ((T, w, m), (8, k)) : ((1, T, LBO), (w T, SBO))`` with ``T`` the
    elements of 16 bytes and ``w T`` those of one swizzle row (``mma_traits_sm90_gmma.hpp``'s comment for
    ``make_gmma_desc<Major::MN>``), evaluated in bytes by the layout evaluator above."""
    from types import SimpleNamespace

    from redfuser.codegen.simulator.wgmma import tile_elements
    from redfuser.ir.simt.types import BufferType, SharedAlloc
    from redfuser.ir.types import float16

    t, width = 16 // itemsize, mode.row_bytes // 16
    lbo, sbo = k * mode.row_bytes, 8 * mode.row_bytes       # MN atoms after all of K; 8-row groups of K
    kernel = SimpleNamespace(shared=(SharedAlloc("tile", BufferType(float16, (n * k,)), align=1024),))
    name, elements = tile_elements(kernel, MatrixDescriptor(0, lbo, sbo, 0, mode), n, k, itemsize, mn_major=True)
    assert name == "tile"
    for row in range(n):
        for kk in range(k):
            canonical = cute_layout(((t, width, n // (t * width)), (8, k // 8)),
                                    ((itemsize, itemsize * t, lbo), (itemsize * t * width, sbo)), row + n * kk)
            assert elements[row, kk] * itemsize == cute_swizzle(*CUTE[mode], canonical), (row, kk)
    assert len({int(e) for e in elements.ravel()}) == n * k                      # a permutation of the tile

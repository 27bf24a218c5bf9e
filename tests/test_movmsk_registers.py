"""An LLVM 22.1 x86 back-end bug (`codegen/movmsk_registers.py`): ``vpmovd2m %xmm24, %k; kmovd %k, %edx`` folded
into the VEX ``vmovmskps %xmm24, %edx``, which VEX cannot encode: the object read xmm8's sign bits."""
from __future__ import annotations

import numpy as np

import redfuser as rf
from redfuser.codegen import native
from redfuser.codegen.movmsk_registers import may_hold_movmsk, misencoded_movmsk
from redfuser.testing import assert_close


def test_a_vex_movmsk_of_an_extended_register_is_told_apart_from_a_valid_one():
    asm = "\tvmovmskps\t%xmm24, %edx\n\tvmovmskps\t%xmm8, %eax\n\tvpmovmskb\t%ymm17, %ecx\n\tvmovmskpd\t%xmm1, %eax\n"
    assert misencoded_movmsk(asm) == ["vmovmskps\t%xmm24, %edx", "vpmovmskb\t%ymm17, %ecx"]
    assert misencoded_movmsk("\tvpmovd2m\t%xmm24, %k1\n\tkmovd\t%k1, %edx\n") == []
    # the bytes LLVM 22.1 emitted for ``vmovmskps %xmm24, %edx``: 3-byte VEX naming xmm8; and the 2-byte form
    assert may_hold_movmsk(b"\x90\xc4\x81\x78\x50\xd0\xc3") and may_hold_movmsk(b"\xc5\xf8\x50\xc0")
    assert not may_hold_movmsk(b"\xc5\xf8\x28\xc1\x62\xb1\x7e\x08\x39\xc8")   # vmovaps, vpmovd2m


def _loss(x, labels):
    m = rf.max(x, axis=-1, keepdims=True)
    lse = rf.log(rf.sum(rf.exp(x - m), axis=-1)) + m[:, 0]
    target = rf.take_along_axis(x, labels[:, None], axis=-1)[:, 0]
    return rf.sum(lse - target), rf.sum(lse * lse)


def test_a_label_gather_reads_the_labels_columns_on_every_row():
    """(Found by a helper porting a training loss.) The SLP vectorizer made four rows' ``labels % 33`` fix-up a
    sign test of a vector, the register allocator put it in xmm24, and on an AVX-512 host rows 3-6 of 7 read
    column 32 whatever their label: the summed cross-entropy was 42.64 for numpy's 49.49. The host's code is
    checked for the misencoded instruction and compiled again without AVX512DQ."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((7, 33)) * 3).astype(np.float32)
    labels = rng.integers(0, 33, 7).astype(np.int32)
    got, want = rf.kernel(_loss, backend="cpu", dynamic=False)(x, labels), _loss(x, labels)
    for g, w in zip(got, want):
        assert_close(g, w, np.float32, 33 * 7)
    one_hot = np.zeros((7, 33), np.float32)
    one_hot[np.arange(7), labels] = 1000.0         # the label's column and only it is large: any other reads 0
    total, _ = rf.kernel(_loss, backend="cpu", dynamic=False)(one_hot, labels)
    assert_close(total, _loss(one_hot, labels)[0], np.float32, 33 * 7)


def test_the_code_that_runs_is_the_code_printed():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((7, 33)) * 3).astype(np.float32)
    labels = rng.integers(0, 33, 7).astype(np.int32)
    text = str(rf.kernel(_loss, backend="cpu").lower(x, labels).stages["llvm"])
    assert misencoded_movmsk(native.assembly(text)) == []

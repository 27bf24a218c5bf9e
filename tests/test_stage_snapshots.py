"""Golden snapshots of the printed ``traced``, ``fused`` and ``tile`` stages of every reference workload.

A change in what the tracer records, what fuses (and how: the rescales, what is deferred) or how a fused
loop is tiled shows up in review as a diff of ``tests/snapshots/stages/<workload>.<stage>.txt``, where a
substring check would let it through. The ``tile`` stage is printed for both schedules, the CPU's and the
GPU's, with the machine-dependent knob (how many programs run at once, which sizes the automatic split)
pinned, so the text is the same on every machine. After an intended change,
``REDFUSER_UPDATE_SNAPSHOTS=1 python -m pytest tests/test_stage_snapshots.py`` rewrites them (review the diff).
"""
from __future__ import annotations

import numpy as np
import pytest
from helpers import SNAPSHOTS, compare

import redfuser as rf
from redfuser.schedule import options_for, schedule_program
from redfuser.workloads import WORKLOADS

STAGES = SNAPSHOTS / "stages"
PINNED_WORKERS = {"cpu": 2, "gpu": 132}   # CI's cores; an H200's SMs (what a GPU schedule plans for)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_printed_stages_of_every_workload(name):
    work = WORKLOADS[name]
    inputs = work.make_inputs(np.random.default_rng(0))
    lowered = rf.kernel(work.fn, backend="interpret").lower(*inputs)
    compare(f"{name}.traced.txt", f"{lowered.stages['traced']}\n", STAGES)
    compare(f"{name}.fused.txt", f"{lowered.stages['fused']}\n", STAGES)
    for target, workers in PINNED_WORKERS.items():
        tile = schedule_program(lowered.program, options_for(target, {"workers": workers}))
        compare(f"{name}.tile-{target}.txt", f"{tile}\n", STAGES)

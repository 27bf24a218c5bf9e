"""The Tile IR: kernels as grids of program instances computing on tiles (what the scheduler builds).

`nodes` holds the ops and kernels, `printer` their text, `verifier` their invariants and `interpreter`
their numpy semantics (a checker for small shapes, not a backend).
"""

"""The Loop IR: one loop nest per traced op, then fused loops (the level tracing builds and fusion rewrites).

`expr` holds the scalar expressions a nest computes, `nodes` the statements and programs, `printer`
their text, `verifier` their invariants, `interpreter` their numpy semantics (the oracle every backend
is checked against) and `rewrite` generic structure-preserving rewrites.
"""

"""The SIMT IR: the per-thread program of one thread block (what the GPU lowering builds).

`nodes` holds the statements and kernels (re-exporting `ops`, the leaf statements, and `types`, the
register types and op enums), `builder` builds a kernel statement by statement, `printer` gives its
text and `verifier` its invariants, with `ranges` the static integer ranges its bounds check uses;
`fragments` says which lane holds which element of a tensor-core `Mma`'s operands (PTX ISA facts), and
`wgmma_fragments` the same for Hopper's warpgroup ``wgmma`` (fragments, shared-memory descriptors, swizzles;
the groundwork of the sm_90a path, not yet used by the lowering).
Its executable semantics is the simulator in `redfuser.codegen.simulator`.
"""

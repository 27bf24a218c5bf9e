"""Code generation: Tile IR to SIMT IR, the SIMT simulator, LLVM IR for nvptx64 and the host.

(Built by the Tile IR and GPU code generation issues; empty in the foundation.)
"""

"""Code generation: Tile IR to SIMT IR, the SIMT simulator, LLVM IR for nvptx64 and the host."""

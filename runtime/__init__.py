"""The runtime: the cuda-python driver wrapper, the CPU JIT loader and the compile cache."""

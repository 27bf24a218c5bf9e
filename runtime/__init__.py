"""The runtime: the cuda-python driver wrapper, the CPU JIT loader and the compile cache.

(Built by the CPU backend and CUDA runtime issues; empty in the foundation.)
"""

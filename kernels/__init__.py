"""Numba-CUDA kernels of dnnkit (installed as dnnkit.kernels), one module per operator family.

Kernels take any array with ``__cuda_array_interface__`` without copying; loop trip counts come from the
problem, never from the grid size. This package imports nothing of dnnkit's API.
"""

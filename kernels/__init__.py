"""syncbench.kernels"""

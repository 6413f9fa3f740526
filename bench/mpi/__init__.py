"""syncbench.bench.mpi"""

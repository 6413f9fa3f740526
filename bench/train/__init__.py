"""syncbench.bench.train"""

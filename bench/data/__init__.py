"""syncbench.bench.data"""

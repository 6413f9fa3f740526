"""syncbench.bench.micro"""

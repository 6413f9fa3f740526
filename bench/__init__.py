"""syncbench.bench"""

"""syncbench.algorithms"""

"""syncbench.analysis"""

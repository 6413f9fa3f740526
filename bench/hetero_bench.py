"""``syncbench hetero``: the same as ``syncbench run hetero`` (kept as an alias).

A 4x slower last rank under SSGD, ASGD, Oscars and Local SGD, in sleep,
spin and work emulation, against the same runs on homogeneous ranks; see
``syncbench run --help`` and ``bench/scenarios/hetero.toml``.
"""

from syncbench.bench.experiment.runner import alias

add_arguments, main = alias("hetero", "syncbench hetero")

"""``syncbench asgd-bench``: the same as ``syncbench run asgd`` (kept as an alias).

ASGD at each lr of a small grid against SSGD, with a 4x slower last rank and
on homogeneous ranks; see ``syncbench run --help`` and
``bench/scenarios/asgd.toml``.
"""

from syncbench.bench.experiment.runner import alias

add_arguments, main = alias("asgd", "syncbench asgd-bench")

"""``syncbench overlap``: the same as ``syncbench run overlap`` (kept as an alias).

SSGD with overlapped bucketed ``Iallreduce``, SSGD with one blocking
``Allreduce`` (the reference of the report's hidden-communication fraction)
and OD-SGD at each lr of a small grid; see ``syncbench run --help`` and
``bench/scenarios/overlap.toml``.
"""

from syncbench.bench.experiment.runner import alias

add_arguments, main = alias("overlap", "syncbench overlap")

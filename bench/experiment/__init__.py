"""The experiment runner: declarative scenarios -> randomised, repeated runs -> tables.

``scenario`` reads and checks a scenario file, ``plan`` expands it into the
runs of every repeat in a seeded random order, ``measure`` reads one run
file's figures through :mod:`syncbench.analysis`, ``aggregate`` turns runs
into medians and ratios, ``tables`` prints them, and ``runner`` is the
``syncbench run`` command that ties them together.
"""

"""``syncbench simulate``: every strategy at 8 to 16,384 ranks, on SimGrid.

The network is SimGrid's (Casanova et al., "Versatile, scalable, and
accurate simulation of distributed applications and platforms", JPDC 2014):
every communication phase of a strategy (one step of a ring, one exchange of
recursive doubling, the pushes of ASGD to their shard owners) is a set of
concurrent flows on a simulated cluster (fat tree, dragonfly, torus, a
user's XML, or a calibration of this machine), and SimGrid's flow-level
model gives its duration, contention included. The rank timeline (compute,
waits, overlap, stragglers) is composed from those durations by the
strategy's own rules: the simulator calls the strategies' pure functions
(Oscars' ``schedule()`` / ``fit_budget()``, ASGD's ``shard_layout()``, the
slowdown parser of ``train``) and never copies them.

Modules: :mod:`.engine` (loading SimGrid, the flow oracle), :mod:`.platform`
(cluster descriptions, calibration), :mod:`.collectives` (the phases of each
collective, MPICH's choice of algorithm), :mod:`.workload` (per-step compute
times from a run file or a named profile, stragglers), :mod:`.timeline` (local
step times and phase rows), :mod:`.progress` (how nonblocking collectives
progress), :mod:`.strategies` (one timeline per communication pattern, a
strategy's ``simulation`` trait), :mod:`.asgd` (ASGD's), :mod:`.decentralized`
(D-PSGD's and AD-PSGD's), :mod:`.hierarchical` (node averages), :mod:`.run` (jobs in
one SimGrid engine), :mod:`.writer` (the ``syncbench/1`` run file),
:mod:`.inputs` (platform, workload and steps from the flags), :mod:`.validate`
(measured vs predicted), :mod:`.sweep` (``syncbench sweep --simulate``),
:mod:`.plots` (scaling on log axes), :mod:`.cli` (the command);
``profiles.toml`` holds the named workloads with their sources.
"""

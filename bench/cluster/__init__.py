"""The emulated cluster: several nodes on this one host, out of real kernel parts.

Each node is a network namespace with its own hostname (a UTS namespace), its
own address and a veth link into a bridge in the root namespace, shaped with
``tc ... tbf`` in both directions; optionally its own CPU set, a CFS quota
that makes it slower (the kernel throttles it, not the suite) and its own
``CLOCK_MONOTONIC`` offset (a time namespace). ``syncbench cluster`` brings it
up and down (:mod:`.command`), launches across it with the venv's MPI
(:mod:`.launch`) and adds its nodes to the local Slurm cluster
(:mod:`.slurm`). Everything ``up`` made is listed in one state file
(:mod:`.state`), and ``down`` removes exactly that.

What the emulation cannot show: one kernel and one memory bus serve every
node; no latency is added to a link (the kernel has no ``netem``: a message's
latency is the network stack's); a node's CPU quota throttles in CFS periods,
not smoothly (docs/CLUSTER.md).
"""

"""The emulated nodes as Slurm nodes (partition ``emulated``): filled in below."""

PARTITION = "emulated"

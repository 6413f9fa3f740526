"""Peer implementations that syncbench's strategies are measured against.

:mod:`syncbench.bench.peers.torch_runner` trains the same ``mlp`` and ``lenet``
architectures as :mod:`syncbench.kernels.zoo` with PyTorch (CPU, gloo),
on the same data shards, batches and step counts as ``syncbench train``:

* ``ssgd`` <-> ``torch.nn.parallel.DistributedDataParallel`` (gradient
  allreduce, bucketed and overlapped with backward);
* ``localsgd`` <-> ``torch.distributed.algorithms.model_averaging.averagers.
  PeriodicModelAverager`` (every rank steps locally, parameters are averaged
  every ``--period`` steps).

:mod:`syncbench.bench.peers.command` (``syncbench peers``) runs ours and the
peer alternately and prints the throughput ratios. PyTorch is an optional
dependency (``pip install 'syncbench[peers]'``); nothing here imports it at
package import time.
"""

"""Peer implementations that syncbench's strategies are measured against.

:mod:`syncbench.bench.experiment.peers.torch_runner` trains the same architectures as
:mod:`syncbench.kernels.zoo` (``mlp``, ``lenet``, and the BatchNorm ResNets
``resnet8`` and ``resnet20`` of He et al. 2016) with PyTorch (CPU, gloo), on
the same data shards, batches and step counts as ``syncbench train``:

* ``ssgd`` <-> ``torch.nn.parallel.DistributedDataParallel`` (gradient
  allreduce, bucketed and overlapped with backward);
* ``localsgd`` <-> ``torch.distributed.algorithms.model_averaging.averagers.
  PeriodicModelAverager`` (every rank steps locally, parameters are averaged
  every ``--period`` steps).

BatchNorm's running statistics stay per rank under DDP (no buffer broadcast)
and are averaged with the parameters under Local SGD.

:mod:`syncbench.bench.experiment.peers.pairs` (``syncbench peers``,
:mod:`syncbench.bench.commands.peers`) plans ours and the peer alternately, runs
them with the experiment runner and prints the throughput ratios (``--speed``: one
process's training step, ours against PyTorch's). PyTorch is an optional dependency
(``pip install 'syncbench[peers]'``); nothing here imports it at
package import time.
"""

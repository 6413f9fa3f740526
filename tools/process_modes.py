"""Is a one-process training rate fixed per process? Blocks of steps in fresh processes.

Usage: python tools/process_modes.py [ours|torch] [MODEL] [PROCESSES] [-- ENV=VALUE ...]

Starts PROCESSES (default 8) fresh processes, one after another, each timing 4
blocks of 30 training steps of MODEL (default lenet; batch 64, float32, one
thread) after 5 untimed ones, and prints one line of samples/s per process. If the
blocks of one process agree while processes differ, the rate is a state of the
process (where its buffers landed), not noise of the moment; ``setarch -R`` in
front (no address randomisation) or ``-- THP_MEM_ALLOC_ENABLE=1`` (PyTorch's huge
pages) test two such states. PyTorch must be importable (``syncbench[peers]``).
"""

from __future__ import annotations

import os
import subprocess
import sys

CHILD = {
    "ours": """
import time, numpy as np
from syncbench.algorithms.optimizer import MomentumSGD
from syncbench.kernels.zoo import build_model
model = build_model(MODEL, (1, 28, 28), 10)
opt = MomentumSGD(model.params, 0.01, 0.9, 0.0)
rng = np.random.default_rng(0)
x = rng.random((64, 1, 28, 28)).astype(np.float32); y = rng.integers(0, 10, 64)
def step():
    model.loss_and_grad(x, y); opt.step(model.params, model.grads)
""",
    "torch": """
import time, torch
torch.set_num_threads(1)
from syncbench.bench.experiment.peers.torch_runner import build_torch_model
model = build_torch_model(MODEL, (1, 28, 28), 10)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x = torch.rand(64, 1, 28, 28); y = torch.randint(0, 10, (64,))
loss = torch.nn.CrossEntropyLoss()
def step():
    opt.zero_grad(); loss(model(x), y).backward(); opt.step()
""",
}
TIMING = """
for _ in range(5):
    step()
rates = []
for _ in range(4):
    t = time.perf_counter()
    for _ in range(30):
        step()
    rates.append(64 * 30 / (time.perf_counter() - t))
print(" ".join(f"{r:8.0f}" for r in rates))
"""


def main(argv: list[str]) -> int:
    env_items = argv[argv.index("--") + 1:] if "--" in argv else []
    args = argv[: argv.index("--")] if "--" in argv else argv
    which = args[0] if args else "ours"
    model = args[1] if len(args) > 1 else "lenet"
    processes = int(args[2]) if len(args) > 2 else 8
    if which not in CHILD:
        print(f"process_modes: expected ours or torch, got {which!r}", file=sys.stderr)
        return 2
    env = dict(os.environ, OMP_NUM_THREADS="1", **dict(e.split("=", 1) for e in env_items))
    code = f"MODEL = {model!r}\n" + CHILD[which] + TIMING
    print(f"# {which} {model}: samples/s of 4 blocks of 30 steps, one process per line")
    for _ in range(processes):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=env)
        if proc.returncode:
            print(f"process_modes: {proc.stderr.strip()[-300:]}", file=sys.stderr)
            return 1
        print(proc.stdout.strip(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

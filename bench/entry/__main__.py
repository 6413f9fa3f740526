"""``python -m syncbench``: the same command line as the ``syncbench`` script."""

import sys

from syncbench.bench.cli import main

sys.exit(main())

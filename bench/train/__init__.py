"""The in-rank side of ``syncbench train``: the driver, its hooks and what a rank records."""

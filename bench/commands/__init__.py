"""The ``syncbench`` sub-commands, one module each (``ssgd_comm.py`` is ``syncbench ssgd-comm``).

A command module is the command's command-line glue and nothing else: its module
docstring is its ``--help`` description (written for its users), ``HELP`` its line
in the command list, ``PASSTHROUGH = True`` when the flags it does not know go to
``syncbench train``, and two functions, ``add_arguments(parser)`` (its flags) and
``run(args)`` (its body; ``run(args, extra)`` for a passthrough command, ``extra``
the flags it does not know), which return the exit status. The work itself lives in
the library modules the body calls. :mod:`syncbench.bench.cli` finds the commands by
listing this package and imports only the one being run. Importing a command module
must stay cheap and must not start MPI: a body that uses MPI imports it when it runs.
"""

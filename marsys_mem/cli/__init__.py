"""The ``marsys-mem`` command line: demo, run, validate, schema, inspect, search.

The top layer: nothing in the library imports it. Modules: ``main`` (the console script,
``marsys_mem.cli.main:main``; it answers ``--version`` before anything heavy is imported),
``commands`` (the parser, the commands, error reporting),
``output`` (plain or rich output, progress), ``demo`` (``marsys-mem demo``) and
``inspect`` (what a store holds, searching it).
"""

from marsys_mem.cli.main import main

__all__ = ["main"]

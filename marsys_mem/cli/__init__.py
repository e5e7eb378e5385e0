"""The ``marsys-mem`` command line: demo, run, validate, schema, inspect, search.

The top layer: nothing in the library imports it.
"""

from marsys_mem.cli.main import main

__all__ = ["main"]

"""``python -m marsys_mem``: the same command line as ``marsys-mem``."""

from marsys_mem.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())

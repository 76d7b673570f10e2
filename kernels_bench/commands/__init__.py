"""One module per ``python -m kernels_bench`` command (``-`` in a name read as ``_``): its
options, checks and printed tables, calling the library packages beside this one (an
import-linter contract keeps commands above them)."""

"""One module per lab command of ``python -m kernels_bench`` (``-`` in a name read as ``_``):
its options and printed tables, calling the lab's packages beside this one."""

"""The measured floor: ``python -m kernels_bench kernels`` times a model shape's decode step
and prefill (and their GEMM and attention parts) in plain torch on the device present.

``decoder``: the decoder and its parts; ``timing``: eager and CUDA-graph timers;
``measure``: the cells timed and the file's content (its options: ``commands.kernels``).
Only torch and the standard library are imported (an import-linter contract keeps it so,
for ``commands.kernels`` too): it runs on a GPU machine with torch alone. The file
it writes becomes twin profiles through ``kernels_bench.lab.twin.floor``. docs/research/twin.md,
"A measured floor".
"""

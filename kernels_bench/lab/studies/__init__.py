"""The studies behind the docs' numbers, one module each, run as
``python -m kernels_bench.lab.studies.<name>`` (``--help`` on each)."""

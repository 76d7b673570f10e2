"""VineLM's offline tools: real executions of a workflow trie on engines (``collect``,
``executors``), their file format (``executions``), the profiling experiments
(``experiment``) and the command line (``python -m kernels_bench vinelm``). The
algorithms they drive (templates, tries, cascade profiling, estimation, search) are the
router's, in ``router.vinelm``."""

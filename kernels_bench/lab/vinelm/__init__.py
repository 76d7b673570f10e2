"""VineLM's benchmark side: real executions of a workflow trie on engines (``collect``,
``executors``), their file format (``executions``), the profiling experiments
(``experiment``; ``python -m kernels_bench vinelm``) and VineLM served live on recorded
executions (``replay``; ``python -m kernels_bench replay-vinelm``). The algorithms they drive
(templates, tries, cascade profiling, estimation, search) are the router's, in
``router.vinelm``."""

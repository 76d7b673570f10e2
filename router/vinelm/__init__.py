"""VineLM: per-invocation model choice for looping workflows over an annotated execution
trie (templates, trie, sparse profiling, estimation, online search); the router policy is
``router.policies.vinelm``, the offline tools that run engines are ``kernels_bench.lab.vinelm``.
See docs/research/vinelm.md."""

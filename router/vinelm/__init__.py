"""VineLM: per-invocation model choice for looping workflows over an annotated execution
trie (templates, trie, sparse profiling, online search); the router policy is
``router.policies.vinelm``. See docs/vinelm.md."""

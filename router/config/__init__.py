"""The cluster file (``cluster.toml``) as the router reads it.

One TOML file describes a cluster; the router loads it with
``router.config.cluster.load_cluster_config``, the launcher with
``launcher.settings.load_launch_config`` (the same, with its own tables typed). Tables:
``[router]`` (listen address, policy and its settings, predictor artifacts) and
``[[engines]]`` (one entry per model deployment, with replicas) here; ``[launcher]`` and
``[cluster]`` in ``launcher.settings``. docs/cluster.md documents every key.

Modules: ``cluster`` (``[router]``, the file, its loader and its rules across tables),
``engines`` (the ``[[engines]]`` entries and instances), ``membership`` (engines joining
and leaving at run time), ``addresses`` (loopback, URLs, ports).
"""

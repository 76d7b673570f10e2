"""The cluster file (``cluster.toml``) as the router reads it: ``cluster`` (``[router]``,
the file, its loader and rules across tables), ``engines`` (``[[engines]]``),
``membership`` (engines joining and leaving at run time), ``addresses``. The launcher's
tables: ``launcher.settings``; every key: docs/cluster.md."""

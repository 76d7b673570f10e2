"""The cluster file (``cluster.toml``) as the router reads it: ``cluster`` (the file,
``[router]``), ``engines`` (``[[engines]]``), ``addresses``; the launcher's tables:
``launcher.settings``; every key: docs/cluster.md."""

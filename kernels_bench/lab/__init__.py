"""The lab: what studies the product rather than serves with it. The trace builder
(``trace``), the serving replay and the artifacts it routes on (``replay``), the digital twin
(``twin``), VineLM's experiments (``vinelm``), fault, soak and fuzz tools (``faults``), one
module per lab command (``commands``) and the studies (``studies``, each
``python -m kernels_bench.lab.studies.<name>``). It uses the product through its public
interfaces; no product module imports it (an import-linter contract), and its third-party
libraries are the ``lab`` extra."""

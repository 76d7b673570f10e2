"""Predictors the policies consume; ``base`` defines their interfaces and static priors.

The trained predictors (``semantic``, ``length``, ``knn``, ``tpot``, ``capability``), their
artifacts, the batched service and ``loader.load_predictors`` are described in
docs/research/predictors.md. This package imports nothing heavy: the policies import ``base``.
"""

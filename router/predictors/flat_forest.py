"""A fitted tree ensemble flattened into arrays and walked for every tree at once.

scikit-learn predicts tree by tree (a Python call per tree and per batch: about 20 ms for
the length forest's 100 trees at batch 1 on one CPU core); the same trees as flat node
arrays are walked by one compiled loop (numba) over every (row, tree) pair, each path
stopping at its leaf: tens of microseconds at batch 1 for 100 trees of depth 21 (a numpy
walk of the whole grid level by level, its first form, cost about 0.25 ms: a few array
operations per level, each paying numpy's call overhead). Each leaf holds one value fixed at
training time: here a quantile of the training targets that fall in it, so the forest
predicts the mean over trees of the leaf quantiles (quantile-forest's
``aggregate_leaves_first=False``), not the quantile of the pooled leaf samples of a
quantile regression forest; docs/research/predictors.md measures what that changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def leaves(x: np.ndarray, feature: np.ndarray, threshold: np.ndarray, children: np.ndarray,
           roots: np.ndarray) -> np.ndarray:
    """(rows, trees) the leaf each row of ``x`` (float32) reaches in each tree: from the
    root, right when ``x[feature] > threshold``, until a node that is its own child."""
    out = np.empty((x.shape[0], roots.shape[0]), np.intp)
    for r in range(x.shape[0]):
        for t in range(roots.shape[0]):
            node = roots[t]
            while children[2 * node] != node:
                node = children[2 * node + (x[r, feature[node]] > threshold[node])]
            out[r, t] = node
    return out


@dataclass(frozen=True)
class FlatForest:
    feature: np.ndarray
    """(nodes,) the split column of each node (0 at leaves, which never move)."""
    threshold: np.ndarray
    """(nodes,) go left when x[feature] <= threshold (scikit-learn's rule)."""
    children: np.ndarray
    """(2 x nodes,) global index of node i's left child at 2i, its right at 2i + 1 (a leaf
    points at itself)."""
    value: np.ndarray
    """(nodes,) a leaf's value (unused at inner nodes)."""
    roots: np.ndarray
    """(trees,) global index of each tree's root."""
    depth: int
    """The deepest tree's depth."""

    @classmethod
    def of(cls, trees: Sequence[Any], x: np.ndarray, y: np.ndarray, quantile: float
           ) -> FlatForest:
        """Flatten fitted scikit-learn trees (``estimator.tree_`` of each); every leaf gets
        the ``quantile`` of the targets ``y`` of the training rows ``x`` that reach it."""
        feature, threshold, left, right, value, roots = [], [], [], [], [], []
        offset, depth = 0, 0
        for est in trees:
            t = est.tree_
            n = t.node_count
            leaf = t.children_left < 0
            idx = np.arange(n)
            roots.append(offset)
            feature.append(np.where(leaf, 0, t.feature))
            threshold.append(np.where(leaf, np.inf, t.threshold))
            left.append(np.where(leaf, idx, t.children_left) + offset)
            right.append(np.where(leaf, idx, t.children_right) + offset)
            v = np.zeros(n)
            reached = est.apply(np.asarray(x, dtype=np.float32))
            order = np.argsort(reached, kind="stable")
            nodes, starts = np.unique(reached[order], return_index=True)
            for node, chunk in zip(nodes, np.split(y[order], starts[1:])):
                v[node] = np.quantile(chunk, quantile)
            value.append(v)
            offset += n
            depth = max(depth, int(t.max_depth))
        cat = np.concatenate
        children = np.stack([cat(left), cat(right)], axis=1).ravel().astype(np.intp)
        return cls(cat(feature).astype(np.intp), cat(threshold).astype(np.float64),
                   children, cat(value), np.asarray(roots, dtype=np.intp), depth)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """(rows,) the mean over trees of the leaf values ``x``'s rows reach."""
        x = np.ascontiguousarray(x, dtype=np.float32)  # scikit-learn compares in float32 too
        return self.value[leaves(x, self.feature, self.threshold, self.children,
                                 self.roots)].mean(axis=1)

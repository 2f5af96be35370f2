"""Cross-validation on the calibration set: stratified k-fold splits with a fixed seed.

Shared by ODIR's (lambda, mu) choice, ``compare_calibrators`` and ``AutoCalibrator``, so that every method
sees the same folds. Built on scikit-learn's ``StratifiedKFold``; classes with fewer samples than folds
(common at K = 100 on a small calibration set) are dealt round-robin instead of making it fail.
"""

from __future__ import annotations

import numpy as np

from hf_calibration._core.checks import check_int


def stratified_folds(labels: np.ndarray, cv: int = 5, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """``cv`` (train, validation) index pairs covering every sample once as validation, stratified by label.

    Deterministic given ``seed``. Each validation fold gets each class's samples in proportion
    (to within one sample); labels seen fewer than ``cv`` times are spread over the folds in turn.

    Example:
        >>> folds = stratified_folds(np.array([0, 0, 1, 1, 1, 0]), cv=3, seed=0)
        >>> sorted(np.concatenate([val for _, val in folds]).tolist())
        [0, 1, 2, 3, 4, 5]
    """
    from sklearn.model_selection import StratifiedKFold

    labels = np.asarray(labels)
    cv = check_int(cv, "cv", minimum=2)
    seed = check_int(seed, "seed", minimum=0)
    n = labels.shape[0]
    if labels.ndim != 1 or n < cv:
        raise ValueError(f"Expected at least `cv` = {cv} labelled samples to split into {cv} folds, but got {n}.")
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)  # shuffle once, so rare classes do not always land in the first folds
    shuffled = labels[order]
    classes, counts = np.unique(shuffled, return_counts=True)
    rare = np.isin(shuffled, classes[counts < cv])
    fold_of = np.empty(n, dtype=np.int64)
    rare_idx = np.flatnonzero(rare)
    rare_idx = rare_idx[np.argsort(shuffled[rare_idx], kind="stable")]  # a rare class's samples go to consecutive folds
    fold_of[rare_idx] = np.arange(rare_idx.size) % cv
    common = np.flatnonzero(~rare)
    if common.size:
        splitter = StratifiedKFold(n_splits=cv, shuffle=True, random_state=seed)
        for fold, (_, val) in enumerate(splitter.split(np.zeros(common.size), shuffled[common])):
            fold_of[common[val]] = fold
    folds = []
    for fold in range(cv):
        val = np.sort(order[fold_of == fold])
        train = np.sort(order[fold_of != fold])
        folds.append((train, val))
    return folds

import numpy as np
import pytest

from hf_calibration.calibrators._machinery.fitting.cv import stratified_folds


@pytest.mark.parametrize("n, k, cv", [(100, 3, 5), (250, 100, 5), (37, 2, 4)])
def test_folds_partition_and_stratify(n, k, cv):
    rng = np.random.default_rng(1)
    labels = rng.integers(0, k, n)
    folds = stratified_folds(labels, cv=cv, seed=0)
    assert len(folds) == cv
    seen = np.concatenate([val for _, val in folds])
    assert np.array_equal(np.sort(seen), np.arange(n))  # every sample validates exactly once
    for train, val in folds:
        assert np.intersect1d(train, val).size == 0 and train.size + val.size == n
        for c in np.unique(labels):  # each class in proportion, to within one sample
            total = int((labels == c).sum())
            assert abs(int((labels[val] == c).sum()) - total / cv) <= 1
    again = stratified_folds(labels, cv=cv, seed=0)
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(folds, again))
    other = stratified_folds(labels, cv=cv, seed=1)
    assert not all(np.array_equal(a[1], b[1]) for a, b in zip(folds, other))


def test_bad_arguments():
    with pytest.raises(ValueError, match="cv"):
        stratified_folds(np.arange(3), cv=5)
    with pytest.raises(ValueError, match="`cv`"):
        stratified_folds(np.arange(10), cv=1)
    with pytest.raises(TypeError, match="`seed`"):
        stratified_folds(np.arange(10), cv=2, seed=0.5)

"""What the calibrators share: the base class and its persistence, the registry, the forward and graph paths, the
fitting routines (solvers, row blocks, folds, the held-out check) and the bases of method families."""

"""Calibrator tests: this folder is on sys.path (as every conftest folder is), so the tests in its subfolders
(``sigmoid/``, ``selection/``, ``_machinery/``) import the shared fixtures (``_calibrator_data``, ``_affine_reference``, ...)."""

"""Sets and scores agree: a conformal predictor records the calibrator its sets were fitted behind, and a served model
whose scores come from another calibrator is refused.

A predictor's fit records ``calibrator_fingerprint``: ``scores_fingerprint`` of its calibrator (``Calibrator.fingerprint``,
a SHA-256 of the kind, the fit record and the weights), None when it was fitted on the model's own scores (no calibrator,
or the identity). A folder whose ``calibrator/`` serves other scores than its ``conformal/`` was fitted on would report
a class scored 1e-12 as ``in_set``; ``check_sets_match_scores`` refuses it. Predictors saved before the record existed
are compared by their calibrator alone, with one warning when they differ.
"""

from __future__ import annotations

from typing import Any

from hf_calibration.calibrators import scores_fingerprint

__all__ = ["FINGERPRINT_KEY", "check_calibrator_fingerprint", "check_sets_match_scores", "sets_fingerprint"]

FINGERPRINT_KEY = "calibrator_fingerprint"


def sets_fingerprint(predictor: Any) -> str | None:
    """The fingerprint of the scores ``predictor``'s sets were fitted on: its record, else its calibrator's."""
    info = predictor.fit_info_ or {}
    return info[FINGERPRINT_KEY] if FINGERPRINT_KEY in info else scores_fingerprint(predictor.calibrator)


def check_calibrator_fingerprint(predictor: Any, calibrator: Any, where: Any) -> None:
    """Refuse a calibrator loaded with a predictor (its ``calibrator/`` subfolder) other than the one its fit recorded
    (a predictor saved without the record is not checked)."""
    info = predictor.fit_info_ or {}
    if FINGERPRINT_KEY in info and info[FINGERPRINT_KEY] != scores_fingerprint(calibrator):
        raise ValueError(
            f"The calibrator in {str(where)!r} is not the one the conformal predictor was fitted behind (their "
            "fingerprints differ): the folder was edited or mixed up. Save the predictor again with its calibrator."
        )


def check_sets_match_scores(predictor: Any, served: Any, where: str) -> bool:
    """Refuse (``ValueError``) a ``predictor`` fitted on other scores than those the ``served`` calibrator gives (None:
    the model's own). Returns False, without raising, for a predictor saved before fingerprints were recorded whose
    calibrator differs from ``served`` (the caller warns once); True when they agree."""
    fitted, serving = sets_fingerprint(predictor), scores_fingerprint(served)
    if fitted == serving:
        return True
    if FINGERPRINT_KEY not in (predictor.fit_info_ or {}):
        return False

    def name(calibrator: Any) -> str:
        return "the model's own scores" if calibrator is None or calibrator.is_identity else f"a {calibrator.kind}"

    raise ValueError(
        f"The conformal predictor in {where} was fitted on {name(predictor.calibrator)}, but the model is served with "
        f"{name(served)} calibrator's scores: its sets would not match the scores (a class scored near 0 could be in "
        "the set). Refit the predictor behind the served calibrator, e.g. "
        "ConformalPredictor(...).fit(logits, labels, calibrator=load_calibrator(folder / 'calibrator')), and save it "
        "in conformal/ again (CalibrationCallback(conformal=...) does both)."
    )

"""CalibrationAccumulator: streamed batches give the batch functions' numbers (themselves checked against
torchmetrics, netcal, relplot and an LP solver), merge / state_dict / reset, bad input, and the Trainer."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from hf_calibration.metrics import accumulator as accumulator_module
from hf_calibration.metrics import adaece, calibration_report, ece, smce, smece
from hf_calibration.metrics._format import prepare, top_label
from hf_calibration.metrics.accumulator import METRICS, CalibrationAccumulator
from hf_calibration.metrics.adaptive import _adaece_compute
from hf_calibration.metrics.smooth import smce_from_confidence, smece_from_confidence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for _models

TOL = 1e-12
PAIR_METRICS = ("adaece", "smce", "smece")


def _data(n=3000, k=7, seed=0, dtype=np.float32, ignored_every=0):
    g = np.random.default_rng(seed)
    labels = g.integers(0, k, n)
    logits = (2.0 * g.standard_normal((n, k)) + 2.5 * np.eye(k)[labels]) * 1.5
    if ignored_every:
        labels[::ignored_every] = -100
    return logits.astype(dtype), labels


def _batches(n, sizes=(1, 2, 500, 777, 3, 1000)):
    """Uneven batch bounds covering [0, n)."""
    start, i = 0, 0
    while start < n:
        stop = min(n, start + sizes[i % len(sizes)])
        yield slice(start, stop)
        start, i = stop, i + 1


def _stream(logits, labels, **kwargs):
    acc = CalibrationAccumulator(**kwargs)
    for rows in _batches(len(labels)):
        acc.update(logits[rows], labels[rows])
    return acc


def _assert_report(got, want, keys=None, tol=TOL):
    keys = keys or [k for k in want.to_dict() if k != "n"]
    assert got.n == want.n
    for key in keys:
        assert got[key] == pytest.approx(want[key], abs=tol, rel=0), key


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("as_torch", [False, True])
def test_streamed_equals_the_batch_report_to_1e_12(dtype, as_torch):
    logits, labels = _data(dtype=dtype, ignored_every=29)
    if as_torch:
        logits, labels = torch.from_numpy(logits), torch.from_numpy(labels)
    want = calibration_report(logits, labels)
    got = _stream(logits, labels, confidence_dtype="float64").compute()
    _assert_report(got, want)
    # ECE also against torchmetrics directly (float64 probabilities, away from its p = 1.0 edge case)
    from torchmetrics.functional.classification import multiclass_calibration_error

    z, y = torch.as_tensor(logits).double(), torch.as_tensor(labels)
    keep = y != -100
    tm = multiclass_calibration_error(torch.softmax(z[keep], 1), y[keep], z.shape[1], n_bins=15, norm="l1")
    assert got.ece == pytest.approx(float(tm), abs=1e-6)


def test_float32_pairs_are_exactly_the_batch_metrics_of_float32_confidences():
    """The default 5-byte pairs: AdaECE / smCE / smECE equal the batch functions on float32-rounded confidences
    to 1e-12, and the float64 ones within the rounding's effect; everything else is untouched by it."""
    logits, labels = _data(n=4000, ignored_every=31)
    acc = _stream(logits, labels)  # confidence_dtype="float32"
    got, want = acc.compute(), calibration_report(logits, labels)
    _assert_report(got, want, keys=[k for k in want.to_dict() if k not in PAIR_METRICS + ("n",)])
    top = top_label(prepare(logits, labels))
    conf32 = top.confidence.astype(np.float32).astype(np.float64)
    assert got.adaece == pytest.approx(_adaece_compute(conf32, top.correct, 15), abs=TOL)
    assert got.smce == pytest.approx(smce_from_confidence(conf32, top.correct), abs=TOL)
    assert got.smece == pytest.approx(smece_from_confidence(conf32, top.correct), abs=TOL)
    for key in PAIR_METRICS:
        assert got[key] == pytest.approx(want[key], abs=1e-7), key
    state = acc.state_dict()
    assert state["confidence"].dtype == torch.float32 and state["correct"].dtype == torch.uint8
    assert state["confidence"].element_size() + state["correct"].element_size() == 5
    assert state["confidence"].shape == (got.n,)


def test_probabilities_are_detected_on_the_first_batch_and_held_to():
    logits, labels = _data(n=1000, dtype=np.float64)
    probs = torch.softmax(torch.from_numpy(logits), 1).numpy()
    got = _stream(probs, labels, confidence_dtype="float64").compute()
    _assert_report(got, calibration_report(probs, labels, from_logits=False))
    acc = CalibrationAccumulator()
    acc.update(probs[:100], labels[:100])
    assert acc.from_logits_ is False
    with pytest.raises(ValueError, match="probabilities like the earlier batches, but it holds logits"):
        acc.update(logits[100:200], labels[100:200])
    with pytest.warns(UserWarning, match="looks like probabilities"):
        forced = CalibrationAccumulator(from_logits=True, confidence_dtype="float64").update(probs, labels).compute()
    with pytest.warns(UserWarning, match="looks like probabilities"):
        _assert_report(forced, calibration_report(probs, labels, from_logits=True))


def test_merge_equals_one_accumulator_over_everything():
    logits, labels = _data(n=2001, ignored_every=17)
    whole = _stream(logits, labels, confidence_dtype="float64").compute()
    parts = [CalibrationAccumulator(confidence_dtype="float64") for _ in range(3)]
    for part, rows in zip(parts, (slice(0, 1), slice(1, 1500), slice(1500, None))):
        part.update(logits[rows], labels[rows])
    merged = parts[0].merge(parts[1]).merge(parts[2]).merge(CalibrationAccumulator(confidence_dtype="float64"))
    _assert_report(merged.compute(), whole)
    with pytest.raises(ValueError, match="n_bins"):
        merged.merge(CalibrationAccumulator(n_bins=10))
    with pytest.raises(ValueError, match="K = 7"):
        merged.merge(CalibrationAccumulator(confidence_dtype="float64").update(*_data(n=50, k=4)))
    with pytest.raises(TypeError, match="other"):
        merged.merge({"n": 3})


def test_state_dict_round_trip_through_torch_save(tmp_path):
    logits, labels = _data(n=900, ignored_every=11)
    acc = _stream(logits[:600], labels[:600])
    torch.save(acc.state_dict(), tmp_path / "acc.pt")
    restored = CalibrationAccumulator().load_state_dict(torch.load(tmp_path / "acc.pt"))
    for a in (acc, restored):
        a.update(logits[600:], labels[600:])
    _assert_report(restored.compute(), acc.compute())
    _assert_report(restored.compute(), _stream(logits, labels).compute())
    with pytest.raises(ValueError, match="confidence_dtype"):
        CalibrationAccumulator(confidence_dtype="float64").load_state_dict(acc.state_dict())
    with pytest.raises(ValueError, match="shape"):
        CalibrationAccumulator(n_bins=10).load_state_dict(acc.state_dict())
    with pytest.raises(ValueError, match="state_dict"):
        CalibrationAccumulator().load_state_dict({"n": torch.tensor(3)})


def test_leaving_out_the_pair_metrics_keeps_no_per_sample_state():
    logits, labels = _data(n=3000)
    acc = _stream(logits, labels, metrics=["ece", "brier"])
    report = acc.compute()
    want = calibration_report(logits, labels)
    _assert_report(report, want, keys=["accuracy", "ece", "mce", "o_ece", "u_ece", "brier"])
    assert report.adaece is None and report.smce is None and report.classwise_ece is None and report.nll is None
    state = acc.state_dict()
    assert state["confidence"].numel() == 0 and state["correct"].numel() == 0
    assert sum(t.numel() for t in state.values()) == 3 * 15 + 7 * 15 + 5  # O(bins * K) and 5 scalars, whatever N
    assert CalibrationAccumulator(metrics=["ece"]).update(logits, labels).state_dict()["classwise"].numel() == 0
    with pytest.raises(ValueError, match="metrics"):
        CalibrationAccumulator(metrics=["ece", "ECE"])
    with pytest.raises(TypeError, match="metrics"):
        CalibrationAccumulator(metrics="ece")


def test_reset_empty_and_fully_ignored_batches():
    logits, labels = _data(n=300)
    acc = CalibrationAccumulator()
    with pytest.raises(ValueError, match="empty"):
        acc.compute()
    acc.update(logits[:0], labels[:0])
    acc.update(logits[:5], np.full(5, -100))  # a padded batch with nothing to count
    assert acc.n == 0 and acc.num_classes == 7
    acc.update(logits, labels)
    first = acc.compute()
    acc.reset().update(logits, labels)
    _assert_report(acc.compute(), first)
    assert acc.reset().n == 0 and acc.num_classes is None


@pytest.mark.parametrize(
    "preds, target, error, match",
    [
        (np.zeros((4, 7, 1), np.float32), np.zeros(4, np.int64), ValueError, "rank 2"),
        (np.zeros((4, 7), np.float32), np.zeros(3, np.int64), ValueError, "same number of samples"),
        (
            np.zeros((4, 7), np.float32),
            np.full(4, 0.5, np.float32),
            ValueError,
            r"`target` to hold class indices.*found 0.5",
        ),
        (np.zeros((4, 7), np.float32), np.array([0, 1, 7, 2]), ValueError, r"class indices in \[0, 7\)"),
        (np.array([[0.0, np.nan] + [0.0] * 5] * 4, np.float32), np.zeros(4, np.int64), ValueError, "finite"),
        (np.zeros((4, 6), np.float32), np.zeros(4, np.int64), ValueError, "K = 7 classes as before, but got K = 6"),
        ("logits", np.zeros(4, np.int64), TypeError, "preds"),
    ],
)
def test_bad_batches_name_the_argument_and_leave_the_state_alone(preds, target, error, match):
    logits, labels = _data(n=100)
    acc = CalibrationAccumulator().update(logits, labels)
    before = {k: v.clone() for k, v in acc.state_dict().items()}
    with pytest.raises(error, match=match):
        acc.update(preds, target)
    after = acc.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_bad_settings():
    with pytest.raises(ValueError, match="n_bins"):
        CalibrationAccumulator(n_bins=0)
    with pytest.raises(TypeError, match="from_logits"):
        CalibrationAccumulator(from_logits="yes")
    with pytest.raises(ValueError, match="confidence_dtype"):
        CalibrationAccumulator(confidence_dtype="float16")
    with pytest.raises(TypeError, match="ignore_index"):
        CalibrationAccumulator(ignore_index=1.5)


@pytest.mark.parametrize("dtype, tol", [(torch.float64, TOL), (torch.float32, 1e-6), (torch.bfloat16, 1e-6)])
def test_device_path_equals_the_batch_functions(monkeypatch, dtype, tol):
    """The on-device reduction (what CUDA tensors take), run here on CPU tensors. float64: to 1e-12; float32 and
    bf16 (upcast exactly): torch's float32 exp may round differently from numpy's, so to float32 precision."""
    monkeypatch.setattr(accumulator_module, "_on_device", lambda preds: isinstance(preds, torch.Tensor))
    logits, labels = _data(n=2500, dtype=np.float64, ignored_every=13)
    z, y = torch.from_numpy(logits).to(dtype), torch.from_numpy(labels)
    got = _stream(z, y, confidence_dtype="float64").compute()
    _assert_report(got, calibration_report(z, y), tol=tol)
    probs = torch.softmax(z.double(), 1)
    _assert_report(
        _stream(probs, y, confidence_dtype="float64").compute(),
        calibration_report(probs, y, from_logits=False),
        tol=tol,
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_are_reduced_on_the_device():
    logits, labels = _data(n=5000, dtype=np.float32, ignored_every=7)
    got = _stream(
        torch.from_numpy(logits).cuda(), torch.from_numpy(labels).cuda(), confidence_dtype="float64"
    ).compute()
    _assert_report(got, calibration_report(logits, labels), tol=1e-6)


def test_single_metric_functions_agree_with_the_report_fields():
    """The accumulator's fields are the functions' values, not just calibration_report's (same inputs)."""
    logits, labels = _data(n=1500, dtype=np.float64)
    got = _stream(logits, labels, confidence_dtype="float64").compute()
    for key, fn in (("ece", ece), ("adaece", adaece), ("smce", smce), ("smece", smece)):
        assert got[key] == pytest.approx(fn(logits, labels), abs=TOL), key
    assert set(METRICS) == set(got.to_dict()) - {"n"}


def test_sync_is_a_no_op_in_a_single_process():
    logits, labels = _data(n=400)
    acc = _stream(logits, labels)
    before = acc.compute()
    _assert_report(acc.sync().compute(), before)


# ----------------------------------------------------------------------------- Trainer


@pytest.mark.parametrize("batch_eval_metrics", [True, False])
def test_trainer_compute_metrics(tmp_path, batch_eval_metrics):
    from _models import digits_dataset, make_model
    from transformers import Trainer, TrainingArguments

    model = make_model("vit", seed=0)
    eval_set = digits_dataset(slice(0, 70))  # 70 = 4 x 16 + 6: a partial last batch
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_eval_batch_size=16,
        use_cpu=True,
        report_to=[],
        batch_eval_metrics=batch_eval_metrics,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, compute_metrics=CalibrationAccumulator(confidence_dtype="float64"))
    metrics = trainer.evaluate(eval_set)
    again = trainer.evaluate(eval_set)  # the accumulator reset itself after the last batch
    with torch.no_grad():
        logits = model.eval()(pixel_values=eval_set.pixel_values).logits.numpy()
    want = calibration_report(logits, eval_set.labels.numpy())
    assert metrics["eval_n"] == again["eval_n"] == 70
    for key in ("accuracy", "ece", "adaece", "mce", "classwise_ece", "smce", "smece", "brier", "nll"):
        assert metrics[f"eval_{key}"] == pytest.approx(want[key], abs=1e-6), key  # one batch of 70 vs batches of 16
        assert again[f"eval_{key}"] == metrics[f"eval_{key}"]


def test_a_batch_with_another_k_is_named_as_such_not_as_bad_labels():
    rng = np.random.default_rng(0)
    acc = CalibrationAccumulator()
    acc.update(rng.normal(size=(10, 5)), np.arange(10) % 5)
    with pytest.raises(ValueError, match=r"K = 5 classes as before, but got K = 4"):
        acc.update(rng.normal(size=(10, 4)), np.full(10, 4))  # label 4 is in range for the first K only
    with pytest.raises(ValueError, match=r"K = 5 classes as before, but got K = 4"):
        acc.update(rng.normal(size=(10, 4)), np.full(10, -100))  # every row ignored: K is still checked
    assert acc.n == 10


@pytest.mark.parametrize("as_torch", [False, True])
def test_float16_batches_equal_the_batch_report(as_torch):
    # issue 23 item 8: float16 (numpy, or CPU torch.half as a Trainer with fp16_full_eval passes) raised numba's
    # NotImplementedError; calibration_report, the batch function, takes the same input
    logits, labels = _data(n=600, dtype=np.float16, ignored_every=31)
    if as_torch:
        logits, labels = torch.from_numpy(logits), torch.from_numpy(labels)
    want = calibration_report(logits, labels)
    _assert_report(_stream(logits, labels, confidence_dtype="float64").compute(), want)
    exact = calibration_report(np.asarray(logits, dtype=np.float64), np.asarray(labels))  # float16 → float64 is exact
    _assert_report(_stream(logits, labels, confidence_dtype="float64").compute(), exact, tol=1e-6)


def test_a_failed_first_batch_fixes_nothing():
    # issue 23 item 12: a first update that raised still fixed K, so the next, good batch was refused
    logits, labels = _data(n=100, k=7)
    acc = CalibrationAccumulator(confidence_dtype="float64")
    with pytest.raises(ValueError, match=r"class indices in \[0, 6\)"):
        acc.update(logits[:, :6], labels)  # K = 6 with labels up to 6: refused
    assert acc.num_classes is None and acc.n == 0
    _assert_report(acc.update(logits, labels).compute(), calibration_report(logits, labels))


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_accelerate_even_batches_padding_is_dropped_on_two_processes(tmp_path):
    # issue 23 item 13: with accelerate's default even_batches=True the last round repeats samples (n = 400 for 397)
    from _accelerate_worker import data
    from _torchrun import TESTS, run_torchrun

    run_torchrun(TESTS / "_accelerate_worker.py", tmp_path, nproc=2, timeout=300)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    z, y = data()
    want = calibration_report(z, y)
    assert [r[True]["world_size"] for r in ranks] == [2, 2]
    assert sum(r[True]["rows_seen"] for r in ranks) == 400  # accelerate repeated 3 samples...
    assert sum(r[True]["rows_kept"] for r in ranks) == 397  # ...which the accumulator dropped
    assert sum(r[False]["rows_seen"] for r in ranks) == 397
    for rank in ranks:
        for even in (True, False):
            got = rank[even]["report"]
            assert got["n"] == 397
            for metric, value in want.to_dict().items():
                assert got[metric] == pytest.approx(value, abs=1e-12, rel=0), (even, metric)


def test_even_batches_padding_by_hand(monkeypatch):
    # 397 samples, batches of 50 on 2 processes: the last round is 97 true rows, gathered in rank order (50 + 47)
    import types

    from hf_calibration._core.distributed import even_batches_padding

    loader = types.SimpleNamespace(
        batch_sampler=types.SimpleNamespace(even_batches=True),
        total_batch_size=100,
        end_of_dataloader=True,
        remainder=97,
    )

    def fake_state(rank, world=2):
        class GradientState:
            _shared_state = {"ready": True}
            in_dataloader, active_dataloader = True, loader
            end_of_dataloader = property(lambda self: loader.end_of_dataloader)
            remainder = property(lambda self: loader.remainder)

        class PartialState:
            num_processes, process_index = world, rank

        monkeypatch.setitem(
            sys.modules,
            "accelerate.state",
            types.SimpleNamespace(GradientState=GradientState, PartialState=PartialState),
        )

    fake_state(rank=0)
    assert even_batches_padding(50) == 0
    fake_state(rank=1)
    assert even_batches_padding(50) == 3
    assert even_batches_padding(49) is None  # not the loader's batch: cannot be located
    loader.remainder = -1  # no dataset length
    assert even_batches_padding(50) is None
    loader.remainder, loader.end_of_dataloader = 97, False  # not the last batch
    assert even_batches_padding(50) == 0
    loader.end_of_dataloader, loader.batch_sampler.even_batches = True, False
    assert even_batches_padding(50) == 0
    loader.batch_sampler.even_batches = True
    logits, labels = _data(n=50)
    acc = CalibrationAccumulator(confidence_dtype="float64").update(logits, labels)  # rank 1's last batch: 47 true rows
    _assert_report(acc.compute(), calibration_report(logits[:47], labels[:47]))
    with pytest.warns(UserWarning, match="cannot be matched to the DataLoader's batches"):
        CalibrationAccumulator().update(logits[:49], labels[:49])
    # issue 29 item 14: on a process whose last batch holds no repeat (rank 0 here), rows fed in slices (a manual loop
    # over contiguous shards of the batch) are all true ones: kept, and no false "counted twice" warning
    fake_state(rank=0)
    assert even_batches_padding(20) == 0 and even_batches_padding(30) == 0
    pieces = CalibrationAccumulator(confidence_dtype="float64")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for start in range(0, 50, 20):
            pieces.update(logits[start : start + 20], labels[start : start + 20])
    _assert_report(pieces.compute(), calibration_report(logits, labels))
    fake_state(rank=1)
    trainer_side = CalibrationAccumulator(confidence_dtype="float64")  # gathered and trimmed by the Trainer: kept whole
    from transformers import EvalPrediction

    assert trainer_side(EvalPrediction(predictions=logits, label_ids=labels))["n"] == 50


# ----------------------------------------------------------------------------- bootstrap intervals


@pytest.mark.parametrize("as_torch", [False, True])
def test_intervals_equal_the_batch_reports(as_torch, tmp_path):
    """ci=: the same resamples of the same rows as calibration_report(ci=...) on the concatenated batches, so the
    same intervals (classwise ECE aside: it stays a bare value, the rows' K probabilities are not kept)."""
    logits, labels = _data(n=2000, dtype=np.float64, ignored_every=13)
    kwargs = dict(ci=0.9, n_boot=150, seed=1, confidence_dtype="float64")
    feed = (lambda a: torch.from_numpy(a)) if as_torch else (lambda a: a)
    acc = CalibrationAccumulator(**kwargs)
    for rows in _batches(len(labels)):
        acc.update(feed(logits[rows]), feed(labels[rows]))
    got = acc.compute()
    want = calibration_report(logits, labels, ci=0.9, n_boot=150, seed=1)
    for key in ("accuracy", "ece", "adaece", "mce", "o_ece", "u_ece", "smce", "smece", "brier", "nll"):
        for part in ("low", "high"):
            assert getattr(got[key], part) == pytest.approx(getattr(want[key], part), abs=1e-12, nan_ok=True), (
                key,
                part,
            )
        assert (got[key].method, got[key].note) == (want[key].method, want[key].note)
        assert float(got[key]) == pytest.approx(float(want[key]), abs=1e-12)
    assert type(got.classwise_ece) is float and got.classwise_ece == pytest.approx(want.classwise_ece, abs=1e-12)
    # the kept rows travel through state_dict and merge
    path = tmp_path / "state.pt"
    torch.save(acc.state_dict(), path)
    restored = CalibrationAccumulator(**kwargs).load_state_dict(torch.load(path))
    assert restored.compute().nll.high == got.nll.high
    first, second = CalibrationAccumulator(**kwargs), CalibrationAccumulator(**kwargs)
    first.update(logits[:900], labels[:900])
    second.update(logits[900:], labels[900:])
    assert first.merge(second).compute().brier.low == pytest.approx(got.brier.low, abs=1e-12)
    # issue 29 item 11: the message named the private attribute ("_boot = Bootstrap(...)"), now the arguments
    with pytest.raises(
        ValueError, match=r"same bootstrap settings, ci=0.9, n_boot=150, seed=1, but got no interval \(ci=None\)"
    ):
        CalibrationAccumulator(**kwargs).merge(CalibrationAccumulator(confidence_dtype="float64"))


def test_default_intervals_are_the_functions_bit_for_bit():
    """Issue 53 item 9: CalibrationAccumulator(ci=0.9) kept float32 confidences and formed ECE from its bin sums, so its
    intervals differed from ece(..., ci=0.9)'s by ~1e-8 relative, where the docs say they are the same. With ci the
    pairs are float64 by default and the binned values come from them: the same interval, bit for bit."""
    from hf_calibration.metrics import adaece, ece, ece_split, smce, smece

    logits, labels = _data(n=2000, ignored_every=11)  # float32 logits
    acc = _stream(logits, labels, ci=0.9, n_boot=120, seed=3)
    assert acc.confidence_dtype == "float64"
    got = acc.compute()
    boot = dict(ci=0.9, n_boot=120, seed=3)
    split = ece_split(logits, labels, **boot)
    want = {
        "ece": ece(logits, labels, **boot),
        "adaece": adaece(logits, labels, **boot),
        "o_ece": split.over,
        "u_ece": split.under,
        "smce": smce(logits, labels, **boot),
        "smece": smece(logits, labels, **boot),
    }
    report = calibration_report(logits, labels, **boot)
    for key, interval in want.items():
        assert (float(got[key]), got[key].low, got[key].high) == (float(interval), interval.low, interval.high), key
    for key in ("accuracy", "ece", "adaece", "o_ece", "u_ece", "smce", "smece", "brier", "nll"):
        assert (got[key].low, got[key].high) == (report[key].low, report[key].high), key


def test_intervals_reach_the_trainer_as_flat_keys():
    logits, labels = _data(n=500)

    class EvalPrediction:
        predictions, label_ids = logits, labels

    out = CalibrationAccumulator(ci=0.95, n_boot=100)(EvalPrediction())
    want = calibration_report(logits, labels, ci=0.95, n_boot=100)
    assert out["ece"] == pytest.approx(float(want.ece), abs=1e-6)
    assert out["ece_ci_low"] == pytest.approx(want.ece.low, abs=1e-6) and out["nll_ci_high"] == pytest.approx(
        want.nll.high, abs=1e-6
    )
    assert "classwise_ece_ci_low" not in out and "ece_ci_low" not in CalibrationAccumulator()(EvalPrediction())
    with pytest.raises(ValueError, match="`ci`"):
        CalibrationAccumulator(ci=1.5)

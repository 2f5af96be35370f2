"""Fits read in blocks of rows (``_rows.FitRows``): the same fit from memory, a memory-mapped ``.npy``, a safetensors
file and a saved ``datasets`` Arrow column; the blocks themselves; temperature scaling's Newton fit against an
independent minimiser; the up-front refusal of K^2-parameter fits."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _calibrator_data import overconfident
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax

from hf_calibration._core.disk_logits import LogitsWriter, as_disk_logits, open_logits
from hf_calibration.calibrators import InsufficientMemoryError, create_calibrator, list_calibrators
from hf_calibration.calibrators._machinery import base as _base
from hf_calibration.calibrators._machinery.base import FORWARD_BLOCK_ELEMENTS  # noqa: F401 - monkeypatched below
from hf_calibration.calibrators._machinery.fitting import rows as _rows
from hf_calibration.calibrators._machinery.fitting.rows import FitRows, MappedRows

pytestmark = pytest.mark.kernels  # also run with numba targeting a CPU without AVX-512 (.ci/run)

BLOCK_METHODS = [m for m in list_calibrators() if create_calibrator(m).fits_in_blocks]
SMALL_BLOCK = 7 * 13  # a block of 13 rows at K = 7: many blocks, the last one short


def _params(calibrator) -> dict[str, np.ndarray]:
    return {name: t.detach().numpy().copy() for name, t in calibrator.state_dict().items()}


def test_the_methods_that_fit_in_blocks():
    assert set(BLOCK_METHODS) == {
        "temperature_scaling",
        "vector_scaling",
        "svs",
        "ets",
        "smart",
        "histogram_binning",
        "isotonic",
        "spline",
    }


def test_blocks_cut_the_same_rows_and_compute_the_view(monkeypatch):
    monkeypatch.setattr(_rows, "BLOCK_ELEMENTS", SMALL_BLOCK)
    z, y = overconfident(100, 7, seed=1)
    keep = np.ones(100, bool)
    keep[[0, 5, 13, 14, 99]] = False
    rows = FitRows(z, keep).view(log_probabilities=False, canonical=True)
    blocks = [(start, block.copy()) for start, block in rows.blocks()]  # a computed block is valid until the next
    assert [start for start, _ in blocks] == [0, 11, 22, 35, 48, 61, 74, 87][: len(blocks)] and len(blocks) == 8
    got = np.concatenate([b for _, b in blocks])
    kept = z[keep]
    np.testing.assert_array_equal(got, kept - kept.max(axis=1, keepdims=True))  # z - max z, exactly
    probs = torch.softmax(torch.from_numpy(z), 1).numpy()
    logp = np.concatenate([b.copy() for _, b in FitRows(probs).view(log_probabilities=True, canonical=False).blocks()])
    np.testing.assert_allclose(logp, np.log(probs), rtol=1e-6)
    np.testing.assert_array_equal(rows.rows(np.array([0, 3, 50])), (kept - kept.max(axis=1, keepdims=True))[[0, 3, 50]])


@pytest.fixture()
def stored(tmp_path):
    """The same logits in memory, in a .npy, a safetensors file and a saved dataset (written by LogitsWriter)."""
    z, y = overconfident(300, 7, seed=3)
    y[[4, 77]] = -100  # ignored rows: dropped in every source alike
    paths = {}
    for name in ("z.npy", "z.safetensors", "dataset"):
        writer = LogitsWriter(tmp_path / name, 300, 7, y)
        for start in range(0, 300, 64):
            writer.write(z[start : start + 64])
        writer.close()
        paths[name] = tmp_path / name
    return z, y, paths


@pytest.mark.parametrize("method", BLOCK_METHODS)
def test_a_fit_from_disk_equals_the_fit_in_memory(method, stored, monkeypatch):
    """Bit for bit: the blocks are cut at the same rows whatever the source, and summed in the same order."""
    monkeypatch.setattr(_rows, "BLOCK_ELEMENTS", SMALL_BLOCK)
    z, y, paths = stored
    memory = create_calibrator(method).fit(z, y, progress_bar=False)
    sources = [
        np.load(paths["z.npy"], mmap_mode="r"),
        open_logits(paths["z.safetensors"]),
        open_logits(paths["dataset"]),
    ]
    for source in sources:
        disk = create_calibrator(method).fit(source, y, progress_bar=False)
        for name, value in _params(memory).items():
            np.testing.assert_array_equal(_params(disk)[name], value, err_msg=f"{method} {name} from {source!r}")
        assert disk.fit_info_["ece_after"] == memory.fit_info_["ece_after"]
    # labels stored beside the logits are used when `labels` is omitted
    from_file = create_calibrator(method).fit(open_logits(paths["z.safetensors"]), progress_bar=False)
    assert all(np.array_equal(v, _params(memory)[k]) for k, v in _params(from_file).items())


@pytest.mark.parametrize("method", ["temperature_scaling", "vector_scaling", "svs", "ets"])
def test_block_size_only_changes_the_rounding(method, monkeypatch):
    z, y = overconfident(400, 9, seed=4)
    whole = create_calibrator(method).fit(z, y, progress_bar=False)
    monkeypatch.setattr(_rows, "BLOCK_ELEMENTS", 9 * 17)
    blocked = create_calibrator(method).fit(z, y, progress_bar=False)
    for name, value in _params(whole).items():
        np.testing.assert_allclose(_params(blocked)[name], value, rtol=1e-6, atol=1e-8, err_msg=name)


def test_a_memmap_is_read_from_its_file(tmp_path):
    z, _ = overconfident(50, 6, seed=5)
    np.save(tmp_path / "z.npy", z)
    m = np.load(tmp_path / "z.npy", mmap_mode="r")
    for view in (m, m[7:31]):
        disk = as_disk_logits(view)
        np.testing.assert_array_equal(np.asarray(disk), np.asarray(view))
    assert as_disk_logits(np.asarray(m)) is None and as_disk_logits(m[:, 1:]) is None  # in memory; not a row range


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_temperature_scaling_newton_reaches_the_nll_minimum(dtype):
    """Against scipy's bounded scalar minimiser of the same NLL (computed with scipy's log_softmax)."""
    z, y = overconfident(2000, 10, seed=6)
    z = z.astype(dtype)
    z64 = z.astype(np.float64)

    def nll(log_t: float) -> float:
        return float(-log_softmax(z64 / math.exp(log_t), axis=1)[np.arange(len(y)), y].mean())

    reference = math.exp(minimize_scalar(nll, bounds=(-3, 4), method="bounded", options={"xatol": 1e-10}).x)
    ts = create_calibrator("temperature_scaling").fit(z, y, progress_bar=False)
    assert ts.fitted_temperature == pytest.approx(reference, rel=1e-6)
    assert ts.fit_info_["best_objective"] == pytest.approx(nll(math.log(ts.fitted_temperature)), rel=1e-12)

    z, y = overconfident(12_000, 10, seed=6)  # beyond twice the warm start's subsample: a few exact passes follow it
    assert create_calibrator("temperature_scaling").fit(z, y, progress_bar=False).fit_info_["steps"] <= 4


def test_temperature_scaling_at_the_bound_and_on_flat_logits():
    z, y = overconfident(500, 5, seed=7)
    right = z.argmax(1)  # every fit sample correct: the NLL falls as T -> 0, the fit stops at T_MIN
    ts = create_calibrator("temperature_scaling").fit(z, right, progress_bar=False)
    assert ts.fitted_temperature == pytest.approx(0.05)
    flat = np.zeros((50, 4), np.float32)  # no curvature anywhere: any T gives the same NLL; the fit stays finite
    ts = create_calibrator("temperature_scaling").fit(flat, np.arange(50) % 4, progress_bar=False)
    assert math.isfinite(ts.fitted_temperature)


@pytest.mark.parametrize("method", ["matrix_scaling", "dirichlet", "sms"])
def test_a_k_squared_fit_that_cannot_fit_is_refused_before_it_starts(method, monkeypatch):
    monkeypatch.setattr(_base, "_available_memory", lambda: 2**30)  # a 1 GiB machine
    z = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (50_000, 21_843), (0, 0))  # no memory behind it
    with pytest.raises(InsufficientMemoryError, match=r"K = 21,843.*K\^2 \+ K = 477,138,492.*1\.0 GiB are available"):
        create_calibrator(method).fit(z, np.zeros(50_000, np.int64), progress_bar=False)
    assert issubclass(InsufficientMemoryError, MemoryError) and issubclass(InsufficientMemoryError, ValueError)


def test_methods_that_fit_in_memory_only_refuse_a_file(tmp_path):
    z, y = overconfident(60, 4, seed=8)
    np.save(tmp_path / "z.npy", z)
    with pytest.raises(TypeError, match="in memory only.*temperature_scaling"):
        create_calibrator("matrix_scaling").fit(np.load(tmp_path / "z.npy", mmap_mode="r"), y, progress_bar=False)


@pytest.mark.parametrize("method", list_calibrators("multiclass"))  # sigmoid ones: tests/serving/test_sigmoid_heads.py
def test_forward_in_blocks_equals_the_whole_array(method, monkeypatch):
    z, y = overconfident(300, 6, seed=9)
    calibrator = create_calibrator(method).fit(z, y, progress_bar=False)
    whole = calibrator(z).numpy()
    monkeypatch.setattr(_base, "FORWARD_BLOCK_ELEMENTS", 6 * 11)
    np.testing.assert_allclose(calibrator(z).numpy(), whole, rtol=1e-6, atol=1e-6)
    bad = z.copy()
    bad[123, 2] = np.nan
    with pytest.raises(ValueError, match="row 123 contains NaN"):
        calibrator(bad)


@pytest.mark.parametrize("method", ["temperature_scaling", "smart"])
def test_fused_forward_in_blocks_writes_into_the_output(method, monkeypatch):
    """Temperature scaling's and SMART's kernel writes each block straight into the output (no block-sized temporary,
    which put a 4.4 GB forward 16 MB over the input plus one output), and a block that overflows takes the torch path."""
    from hf_calibration.calibrators._machinery.forward import apply as _apply

    z, y = overconfident(300, 6, seed=9)
    calibrator = create_calibrator(method).fit(z, y, progress_bar=False)
    whole = calibrator(z).numpy()
    huge = z.copy()
    huge[150] *= np.float32(3e38) / np.abs(huge[150]).max()  # |z| / T beyond float32 once T < 1
    if method == "temperature_scaling":
        with torch.no_grad():
            calibrator.log_temperature.fill_(math.log(0.5))
    huge_whole = calibrator(huge).numpy()
    monkeypatch.setattr(_base, "FORWARD_BLOCK_ELEMENTS", 6 * 11)
    targets = []
    scale = _apply._scale
    monkeypatch.setattr(_apply, "_scale", lambda *a: targets.append(a[3:]) or scale(*a))  # SMART's T(m) alone: 3 args
    blocked = calibrator(huge)
    np.testing.assert_array_equal(blocked.numpy(), huge_whole)
    writes = [t[0] for t in targets if t]
    assert len(writes) == math.ceil(300 / 11)
    assert all(np.shares_memory(t, blocked.numpy()) for t in writes)
    if method == "temperature_scaling":  # the overflowing row went through the torch path: finite, argmax kept
        assert np.isfinite(huge_whole[150]).all() and huge_whole[150].argmax() == huge[150].argmax()
    else:
        np.testing.assert_array_equal(calibrator(z).numpy(), whole)


def test_mapped_rows_are_kept_in_memory_and_recomputed_from_disk(tmp_path, monkeypatch):
    monkeypatch.setattr(_rows, "BLOCK_ELEMENTS", 5 * 8)
    z, _ = overconfident(40, 5, seed=10)
    np.save(tmp_path / "z.npy", z)
    calls = []

    def double(block):
        calls.append(block.shape[0])
        return 2 * block

    in_memory = MappedRows(FitRows(z), double)
    on_disk = MappedRows(FitRows(open_logits(tmp_path / "z.npy")), double)
    assert len(calls) == 5  # computed once, at construction, for the in-memory rows
    for _ in range(2):
        np.testing.assert_array_equal(np.concatenate([b.copy() for _, b in in_memory.blocks()]), 2 * z)
        np.testing.assert_array_equal(np.concatenate([b.copy() for _, b in on_disk.blocks()]), 2 * z)
    assert len(calls) == 5 + 2 * 5  # from disk: at every pass


def test_mapped_rows_keep_a_leading_part_up_to_a_size_and_recompute_the_rest(monkeypatch):
    """SVS keeps its features up to the input's size less a margin (at 50,000 x 21,843 the whole features and the fit's
    own 5 MB were over the input plus one buffer): the leading blocks are kept, the others computed at every pass."""
    monkeypatch.setattr(_rows, "BLOCK_ELEMENTS", 5 * 8)
    z, _ = overconfident(40, 5, seed=10)
    calls = []

    def double(block):
        calls.append(block.shape[0])
        return 2 * block

    partial = MappedRows(FitRows(z), double, keep_bytes=3 * 8 * 5 * 4 + 7)  # room for three blocks of 8 rows
    assert len(calls) == 3
    for _ in range(2):
        np.testing.assert_array_equal(np.concatenate([b.copy() for _, b in partial.blocks()]), 2 * z)
    assert calls == [8] * 3 + [8, 8] * 2  # the last two blocks again at each pass
    assert [start for start, _ in partial.blocks()] == [0, 8, 16, 24, 32]


def test_svs_keeps_its_features_below_the_input_size(monkeypatch):
    """What SVS keeps of its features stays a margin below the input's size, and the fit is the one that keeps them
    all, bit for bit (the blocks it does not keep are computed again, by the same kernel)."""
    from hf_calibration.calibrators import _structured as _structured

    monkeypatch.setattr(_rows, "BLOCK_ELEMENTS", 40 * 100)  # 75 blocks of 100 rows
    z, y = overconfident(7500, 40, seed=4)
    kept = []
    mapped = _structured.MappedRows

    def spy(*args, **kwargs):
        out = mapped(*args, **kwargs)
        kept.append(sum(b.nbytes for _, b in out._kept))
        return out

    monkeypatch.setattr(_structured, "MappedRows", spy)
    svs = create_calibrator("svs").fit(z, y, progress_bar=False)
    assert z.nbytes - 2 * z.nbytes // 64 <= kept[0] <= z.nbytes - z.nbytes // 64  # one block short of the whole
    monkeypatch.setattr(_structured, "FIT_MARGIN_BYTES", 0)
    full = create_calibrator("svs").fit(z, y, progress_bar=False)
    assert kept[1] == z.nbytes
    torch.testing.assert_close(svs.weight, full.weight, rtol=0, atol=0)
    torch.testing.assert_close(svs.bias, full.bias, rtol=0, atol=0)

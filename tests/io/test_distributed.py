"""Two CPU processes (torchrun, gloo): predict_logits gives every process the logits of one process, in dataset order,
each sample once; CalibrationAccumulator.sync() gives every process the single-process metrics, with uneven shards."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from _distributed_worker import PARTS, accumulator_data
from _image_data import digits_dataset_dict, save_classifier
from _torchrun import run_torchrun

from hf_calibration._core.distributed import shard_range
from hf_calibration.io import predict_logits
from hf_calibration.metrics import CalibrationAccumulator, calibration_report

HERE = Path(__file__).resolve().parents[1]  # tests/, where the worker scripts are


@pytest.mark.parametrize("n, world", [(37, 2), (5, 3), (2, 4), (0, 2), (100, 7)])
def test_shards_cover_every_row_once_in_order(n, world):
    shards = [shard_range(n, rank, world) for rank in range(world)]
    assert [i for shard in shards for i in shard] == list(range(n))
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    root, out = tmp_path_factory.mktemp("ddp_root"), tmp_path_factory.mktemp("ddp_out")
    save_classifier("vit", root / "vit")
    digits_dataset_dict().save_to_disk(str(root / "saved"))
    run_torchrun(HERE / "_distributed_worker.py", root, out)
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    return root, out, ranks


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_predict_logits_on_two_processes_equals_one_process(two_processes):
    root, out, ranks = two_processes
    assert [r["world_size"] for r in ranks] == [2, 2]
    np.testing.assert_array_equal(ranks[0]["logits"], ranks[1]["logits"])  # the same gathered array everywhere
    np.testing.assert_array_equal(ranks[0]["labels"], ranks[1]["labels"])
    logits, labels = predict_logits(str(root / "vit"), str(root / "saved"), split="test", batch_size=4, progress=False)
    assert ranks[0]["logits"].shape == logits.shape == (37, 10)  # 19 + 18 rows, nothing padded or repeated
    np.testing.assert_array_equal(ranks[0]["labels"], labels)
    np.testing.assert_allclose(ranks[0]["logits"], logits, rtol=0, atol=1e-5)  # row for row: the same order
    # rank 0 alone wrote the cache entry, holding the gathered result
    (entry,) = list((out / "cache").glob("*.npz"))
    with np.load(entry) as cached:
        np.testing.assert_array_equal(cached["logits"], ranks[0]["logits"])


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_synced_accumulator_equals_one_process(two_processes):
    _, _, ranks = two_processes
    z, y = accumulator_data()
    want = calibration_report(z, y)
    for name in PARTS:
        single = CalibrationAccumulator().update(z, y).compute()
        for dtype, reference in (("float64", want), ("float32", single)):
            for key in ((name, dtype), (name, dtype, "again")):
                for rank in ranks:
                    got = rank["reports"][key]
                    assert got["n"] == reference.n
                    for metric, value in reference.to_dict().items():
                        assert got[metric] == pytest.approx(value, abs=1e-12, rel=0), (key, metric)
    resumed = calibration_report(np.concatenate([z, z[:100]]), np.concatenate([y, y[:100]]))
    for rank in ranks:
        for metric, value in resumed.to_dict().items():
            assert rank["reports"]["resumed"][metric] == pytest.approx(value, abs=1e-12, rel=0), metric


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_sync_refuses_when_accelerate_did_not_shard(two_processes):
    _, _, ranks = two_processes
    for rank in ranks:
        if rank["accelerate_processes"] == 2:  # an accelerate that sees both processes: nothing to refuse
            assert rank["accelerate_conflict"] is None
        else:
            assert "accelerate reports 1 process(es) but torch.distributed holds 2" in rank["accelerate_conflict"]

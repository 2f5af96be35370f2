"""Pixel-logit calibration: package temperature scaling on pixel rows (against scipy), Local Temperature Scaling."""

import json

import pytest
import torch
from scipy.optimize import minimize_scalar

from hf_calibration.calibrators import TemperatureScaling
from hf_calibration.segmentation import LocalTemperatureScaling, calibrate_pixels, pixel_rows


def _nll(logits, target):
    return torch.nn.functional.cross_entropy(logits.double(), target, ignore_index=255).item()


@pytest.fixture(scope="module")
def two_regions():
    """Pixels on the image's bright half are right 60 % of the time, the rest 97 %, at one confidence: no single
    temperature fits both, a temperature read off the image does."""
    g = torch.Generator().manual_seed(0)

    def draw(b):
        image = torch.zeros(b, 1, 16, 16)
        image[:, :, :, :8] = 1.0
        pred = torch.randint(0, 3, (b, 16, 16), generator=g)
        right = torch.rand(b, 16, 16, generator=g) < torch.where(image[:, 0] > 0, 0.6, 0.97)
        target = torch.where(right, pred, (pred + torch.randint(1, 3, (b, 16, 16), generator=g)) % 3)
        target[:, 0, 0] = 255
        logits = 3 * torch.nn.functional.one_hot(pred, 3).permute(0, 3, 1, 2).float()
        return logits, target, image

    return draw(8), draw(8)


def test_pixel_rows_by_hand():
    logits = torch.arange(8.0).reshape(1, 2, 2, 2)  # channel 0: 0 1 2 3, channel 1: 4 5 6 7
    rows, labels = pixel_rows(logits, torch.tensor([[[0, 255], [1, 0]]]))
    assert rows.tolist() == [[0.0, 4.0], [2.0, 6.0], [3.0, 7.0]] and labels.tolist() == [0, 1, 0]
    assert pixel_rows(logits, torch.tensor([[[0, 1], [1, 0]]]), max_pixels=2)[0].shape == (2, 2)
    with pytest.raises(ValueError, match="labels in"):
        pixel_rows(logits, torch.tensor([[[0, 2], [1, 0]]]))


def test_temperature_scaling_on_pixels_equals_scipy(two_regions):
    (logits, target, _), _ = two_regions
    rows, labels = pixel_rows(logits, target)
    z = rows.double()
    best = minimize_scalar(lambda t: _nll(z / t, labels), bounds=(0.2, 10), method="bounded", options={"xatol": 1e-9}).x
    ts = TemperatureScaling().fit(rows, labels)
    assert 1 / ts.temperature(rows)[0].item() == pytest.approx(1 / best, rel=1e-4)
    out = calibrate_pixels(ts, logits)
    assert out.shape == logits.shape
    torch.testing.assert_close(
        torch.softmax(out.double(), 1), torch.softmax(logits.double() / best, 1), atol=1e-4, rtol=0
    )


@pytest.fixture
def one_thread():
    """Tiny convolutions: one thread is several times faster than two on a busy CI box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_local_temperature_beats_one_temperature(two_regions, tmp_path, one_thread):
    (logits, target, image), (test_logits, test_target, test_image) = two_regions
    lts = LocalTemperatureScaling(3, image_channels=1, hidden=4)
    torch.testing.assert_close(lts(logits, image), logits)  # T = 1 before the fit
    lts.fit(logits, target, image, steps=60, lr=2e-2, held_out=(test_logits, test_target, test_image))
    ts = TemperatureScaling().fit(*pixel_rows(logits, target))
    with torch.no_grad():
        local = lts(test_logits, test_image)
    one = _nll(calibrate_pixels(ts, test_logits), test_target)
    assert _nll(local, test_target) < one - 0.05 < _nll(test_logits, test_target)
    assert torch.equal(local.argmax(1), test_logits.argmax(1))
    t = lts.temperature(test_logits, test_image)
    assert t[:, :, :, :8].mean() > 1.5 > 1 > t[:, :, :, 8:].mean()  # hotter where the labels disagree more
    lts.save_pretrained(tmp_path / "lts")
    loaded = LocalTemperatureScaling.from_pretrained(tmp_path / "lts")
    torch.testing.assert_close(loaded(test_logits, test_image), local, atol=0, rtol=0)
    # the card's held-out pixel ECE after the map is torchmetrics' on the flattened, ignore-masked pixels
    from torchmetrics.functional.classification import multiclass_calibration_error

    probs, labels = local.double().softmax(1).permute(0, 2, 3, 1).reshape(-1, 3), test_target.reshape(-1)
    keep = labels != 255
    reference = float(multiclass_calibration_error(probs[keep], labels[keep], 3, n_bins=15))
    held = loaded.fit_info_["held_out"]
    assert held["ece_after"] == pytest.approx(reference, abs=1e-5)  # torchmetrics sums in float32
    assert held["ece_after"] < held["ece_before"]
    card = (tmp_path / "lts" / "README.md").read_text()
    assert "image-segmentation" in card.split("---")[1]
    assert f"| pixel ECE (15 bins) | held-out set | {100 * held['ece_before']:.2f}% | {100 * reference:.2f}% |" in card
    config = json.loads((tmp_path / "lts" / "config.json").read_text())
    config["hidden"] = 8  # an edited architecture: refused before any weight is read as another shape
    (tmp_path / "lts" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="config.json' does not match its weights|does not fit|size mismatch"):
        LocalTemperatureScaling.from_pretrained(tmp_path / "lts")
    config["hidden"], config["fit"]["steps"] = 4, 61
    (tmp_path / "lts" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config.json' does not match its weights \(fit\.steps"):
        LocalTemperatureScaling.from_pretrained(tmp_path / "lts")
    with pytest.raises(ValueError, match="`images`"):
        lts(test_logits)
    with pytest.raises(ValueError, match="channels"):
        lts(test_logits[:, :2], test_image)


def test_local_temperature_fit_depends_on_its_seed_not_on_the_global_random_state(two_regions, one_thread):
    (logits, target, image), _ = two_regions
    fits = []
    for global_seed, seed in ((1, 0), (2, 0), (1, 1)):
        torch.manual_seed(global_seed)
        lts = LocalTemperatureScaling(3, image_channels=1, hidden=4).fit(logits, target, image, steps=3, seed=seed)
        fits.append(lts.temperature(logits, image))
    lts = LocalTemperatureScaling(3, image_channels=1, hidden=4)
    state = torch.random.get_rng_state()
    lts.fit(logits, target, image, steps=1)
    assert torch.equal(torch.random.get_rng_state(), state)  # fit leaves the user's random stream where it was
    assert torch.equal(fits[0], fits[1]) and not torch.equal(fits[0], fits[2])

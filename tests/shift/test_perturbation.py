"""fit_for_shift (Tomani et al., CVPR 2021): the held-out images perturbed from clean to near chance, the calibrator fitted
on the union; checked against the same union built here by hand, with the recipe saved, loaded, attached and exported."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _image_data import write_route

from hf_calibration.calibrators import create_calibrator, load_calibrator
from hf_calibration.shift.perturbation import ShiftTradeoffWarning, fit_on_perturbed, perturb, strength_schedule


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return write_route(tmp_path_factory.mktemp("perturbation_route"))


def test_perturb_is_seeded_per_image_and_clipped():
    images = np.random.default_rng(0).integers(0, 256, (5, 8, 8, 3), dtype=np.uint8)
    once, twice = perturb(images, 0.3, seed=1), perturb(images, 0.3, seed=1)
    np.testing.assert_array_equal(once, twice)
    assert not np.array_equal(perturb(images, 0.3, seed=2), once)
    np.testing.assert_array_equal(perturb(images, 0.0, seed=1), images)
    np.testing.assert_array_equal(perturb(images[2:3], 0.3, seed=1, offset=2), once[2:3])  # image i's own noise
    noise = once.astype(float) - images
    inside = (images > 40) & (images < 215)  # away from the clipping
    assert abs(noise[inside].std() / 255 - 0.3) < 0.05


def test_perturb_keeps_float_and_uint16_pixels_in_their_range():
    """Floats in [0, 1] and uint16 pixels get the noise on their own scale, in their own dtype: image i's noise is the
    standard normal of numpy's generator seeded (seed, i), times the strength, added to the pixel in units of its range
    (formerly floats came back as black uint8 images and uint16 saturated at 255)."""
    noise = np.stack([np.random.default_rng((7, i)).standard_normal((6, 6), dtype=np.float32) for i in range(2)])
    flat = np.full((2, 6, 6), 0.5, dtype=np.float32)
    out = perturb(flat, 0.1, seed=7)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, np.clip(0.5 + 0.1 * noise.astype(np.float64), 0, 1), atol=1e-7)
    assert perturb(np.ones((1, 6, 6)), 1.0, seed=7).max() == 1.0  # clipped to the range
    deep = np.full((2, 6, 6), 30000, dtype=np.uint16)
    out = perturb(deep, 0.1, seed=7)
    assert out.dtype == np.uint16
    expected = np.clip(np.rint(30000 + 0.1 * 65535 * noise.astype(np.float64)), 0, 65535)
    np.testing.assert_allclose(out, expected, atol=1)  # float32 arithmetic: within one level of 65,535


def test_perturb_refuses_what_it_cannot_read():
    images = np.zeros((2, 6, 6), dtype=np.uint8)
    for strength in (float("nan"), float("inf"), -0.1):
        with pytest.raises(ValueError, match="`strength`"):
            perturb(images, strength)
    with pytest.raises(ValueError, match=r"`images` of a float dtype to hold pixels in \[0, 1\].*\[0\.0, 255\.0\]"):
        perturb(np.array([[[0.0, 255.0]]]), 0.1)
    with pytest.raises(ValueError, match="`images`"):
        perturb(np.array([[[0.5, np.nan]]]), 0.1)
    with pytest.raises(TypeError, match="`images` to be uint8, uint16 or float"):
        perturb(np.zeros((1, 6, 6), dtype=np.int32), 0.1)


def test_the_schedule_spans_clean_to_near_chance():
    """A model whose accuracy falls as 0.9 * exp(-s): 10 classes, chance 0.1; the top strength is where it reaches
    0.1 + 0.1 * (0.9 - 0.1) = 0.18, i.e. s = log(0.9 / 0.18) = 1.609, found to bisection accuracy."""
    accuracy = lambda s: 0.9 * np.exp(-s) if s > 0 else 0.9  # noqa: E731
    strengths, accuracies = strength_schedule(lambda s: max(accuracy(s), 0.1), levels=5, num_classes=10)
    assert strengths[0] == 0 and len(strengths) == 5 and np.all(np.diff(strengths) > 0)
    assert strengths[-1] == pytest.approx(np.log(0.9 / 0.18), abs=1e-3)
    assert accuracies[0] == 0.9 and accuracies[-1] == pytest.approx(0.18, abs=1e-3)


def test_fit_on_perturbed_is_the_fit_on_the_union_with_the_recipe():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 5, 400)
    levels = [4 * rng.normal(size=(400, 5)) + 6 * np.eye(5)[y] * w for w in (1.0, 0.5, 0.1)]
    recipe = {
        "perturbation": "gaussian_noise",
        "strengths": [0.0, 0.2, 0.4],
        "seed": 0,
        "accuracies": [0.9, 0.6, 0.3],
        "levels": 3,
    }
    with pytest.warns(ShiftTradeoffWarning):  # the weakest level's confidence is far below the clean one's
        fitted = fit_on_perturbed(levels, y, "temperature_scaling", recipe=recipe)
    by_hand = create_calibrator("temperature_scaling").fit(np.concatenate(levels), np.tile(y, 3), progress_bar=False)
    assert fitted.fitted_temperature == pytest.approx(by_hand.fitted_temperature, rel=1e-12)
    assert fitted.fit_info_["shift_fit"]["strengths"] == [0.0, 0.2, 0.4]
    assert fitted.fit_info_["shift_fit"]["num_images"] == 400
    with pytest.raises(ValueError, match="softmax calibrator"):
        fit_on_perturbed(levels, y, "platt", recipe=recipe)


def test_fit_on_perturbed_refuses_levels_its_recipe_does_not_describe():
    """Levels of different K raised numpy's own concatenate error; a fourth level beside a recipe of three was fitted,
    the recipe recorded as given and `clean_ece` silently None."""
    rng = np.random.default_rng(3)
    y = rng.integers(0, 4, 100)
    recipe = {"perturbation": "gaussian_noise", "strengths": [0.0, 0.2, 0.4], "seed": 0, "accuracies": [], "levels": 3}
    with pytest.raises(ValueError, match=r"same K classes, but logits\[0\] has K = 4 and logits\[2\] K = 5"):
        fit_on_perturbed([rng.normal(size=(100, 4))] * 2 + [rng.normal(size=(100, 5))], y, recipe=recipe)
    with pytest.raises(ValueError, match=r"`logits\[1\]` and `labels` to have the same number of samples"):
        fit_on_perturbed([rng.normal(size=(100, 4)), rng.normal(size=(90, 4))], y, recipe={})
    with pytest.raises(ValueError, match=r"`recipe` to describe the 4 levels of `logits`, but its 'strengths' gives 3"):
        fit_on_perturbed([rng.normal(size=(100, 4))] * 4, y, recipe=recipe)
    with pytest.raises(ValueError, match=r"`recipe` to describe the 3 levels of `logits`, but its 'levels' gives 2"):
        fit_on_perturbed([rng.normal(size=(100, 4))] * 3, y, recipe={**recipe, "levels": 2})


def test_what_fitting_for_shift_costs_on_clean_data_is_measured_and_warned():
    """Clean logits drawn calibrated (labels from their own softmax) and two levels of pure noise (labels unrelated):
    the union's one temperature is far too high for the clean level. The recorded clean ECEs are checked against
    torchmetrics on the same calibrated outputs, and the fit warns."""
    from torchmetrics.functional.classification import multiclass_calibration_error

    rng = np.random.default_rng(4)
    n, k = 2000, 5
    clean = 3 * rng.normal(size=(n, k))
    p = np.exp(clean - clean.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    y = (p.cumsum(1) > rng.random((n, 1))).argmax(1)
    noise = [3 * rng.normal(size=(n, k)) for _ in range(2)]
    recipe = {"perturbation": "gaussian_noise", "strengths": [0.0, 0.5, 1.0], "seed": 0, "accuracies": [], "levels": 3}
    with pytest.warns(ShiftTradeoffWarning, match="under-confident on unshifted data"):
        fitted = fit_on_perturbed([clean] + noise, y, "temperature_scaling", recipe=recipe)
    clean_only = create_calibrator("temperature_scaling").fit(clean, y, progress_bar=False)

    def reference(calibrator):
        out = calibrator(torch.from_numpy(clean)).double()
        return float(multiclass_calibration_error(out.softmax(1), torch.from_numpy(y), num_classes=k, n_bins=15))

    record = fitted.fit_info_["shift_fit"]
    assert record["clean_ece"] == pytest.approx(reference(fitted), abs=1e-6)  # torchmetrics: float32
    assert record["clean_only_ece"] == pytest.approx(reference(clean_only), abs=1e-6)
    assert record["clean_ece"] > record["clean_only_ece"] + 0.1  # T >> 1 on calibrated logits: far under-confident


def test_fit_for_shift_on_a_model_and_a_dataset(root, tmp_path):
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    from hf_calibration.shift import fit_for_shift

    calibrator = fit_for_shift(
        root / "vit",
        root / "saved",
        "temperature_scaling",
        split="validation",
        levels=4,
        seed=0,
        batch_size=16,
        progress_bar=False,
    )
    recipe = calibrator.fit_info_["shift_fit"]
    assert recipe["perturbation"] == "gaussian_noise" and len(recipe["strengths"]) == 4 and recipe["strengths"][0] == 0
    assert recipe["accuracies"][0] > recipe["accuracies"][-1]  # from clean towards chance
    # the same union by hand: each validation image perturbed with the processor's seeded noise at each strength
    import datasets

    from hf_calibration.shift.perturbation import PerturbingProcessor

    data = datasets.load_from_disk(str(root / "saved"))["validation"]
    model = AutoModelForImageClassification.from_pretrained(root / "vit").eval()
    processor = AutoImageProcessor.from_pretrained(root / "vit")
    images, labels = [row["img"] for row in data], np.asarray(data["digit"])
    union = []
    for strength in recipe["strengths"]:
        proc = processor if strength == 0 else PerturbingProcessor(processor, strength, 0)
        with torch.no_grad():
            union.append(model(pixel_values=proc(images=images, return_tensors="pt")["pixel_values"]).logits.numpy())
    by_hand = create_calibrator("temperature_scaling").fit(
        np.concatenate(union), np.tile(labels, len(union)), progress_bar=False
    )
    assert calibrator.fitted_temperature == pytest.approx(by_hand.fitted_temperature, rel=1e-5)
    # saved, loaded, carded, attached, exported like every calibrator
    calibrator.save_pretrained(tmp_path / "cal")
    loaded = load_calibrator(tmp_path / "cal")
    assert loaded.fit_info_["shift_fit"] == recipe
    assert "Fitted to survive shift" in (tmp_path / "cal" / "README.md").read_text()
    pixels = processor(images=images[:4], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        plain = model(pixel_values=pixels).logits
        loaded.attach(model)
        torch.testing.assert_close(model(pixel_values=pixels).logits, loaded(plain))
        loaded.detach()


def test_bad_arguments(root):
    from hf_calibration.shift import fit_for_shift

    with pytest.raises(ValueError, match="perturbation"):
        fit_for_shift(root / "vit", root / "saved", perturbation="blur")
    with pytest.raises(ValueError, match="levels"):
        strength_schedule(lambda s: 0.5, levels=1, num_classes=10)
    for strengths in ([0.0, float("nan")], [0.0, -0.5]):
        with pytest.raises(ValueError, match="`strengths`"):
            fit_for_shift(root / "vit", root / "saved", strengths=strengths)
    with pytest.raises(ValueError, match="`strengths`"):
        fit_for_shift(root / "vit", root / "saved", strengths=[])


def test_the_command_line_route(root, tmp_path, capsys):
    from hf_calibration.cli import main

    code = main(["fit", "--model", str(root / "vit"), "--dataset", str(root / "saved"), "--split", "validation",
                 "--method", "ts", "--for-shift", "--levels", "3", "--batch-size", "16", "--no-cache",
                 "--out", str(tmp_path / "cal"), "--json"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    recipe = load_calibrator(tmp_path / "cal").fit_info_["shift_fit"]
    assert recipe["levels"] == 3 and recipe["perturbation"] == "gaussian_noise"
    from hf_calibration.io import save_logits

    capsys.readouterr()
    rng = np.random.default_rng(0)
    file = save_logits(tmp_path / "z.npz", rng.normal(size=(50, 3)), rng.integers(0, 3, 50))
    code = main(["fit", "--logits", str(file), "--method", "ts", "--for-shift", "--out", str(tmp_path / "x")])
    assert code != 0 and "--for-shift perturbs the images" in capsys.readouterr().err

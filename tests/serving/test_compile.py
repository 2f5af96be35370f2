"""A model with an attached calibrator under ``torch.export.export`` and ``torch.compile``: the same outputs as the
eager model, one graph (no break caused by the calibrator), for a temperature and a piecewise (histogram) map."""

from __future__ import annotations

import pytest
import torch
from _trained import logits_of, pixels, splits, trained

from hf_calibration.calibrators import create_calibrator

torch.set_num_threads(1)


@pytest.fixture(scope="module", params=["temperature_scaling", "histogram_binning", "dirichlet"])
def calibrated(request):
    data = splits()
    model = trained("vit")
    x = pixels(data.calibration_images)
    calibrator = create_calibrator(request.param).fit(logits_of(model, x), data.calibration_labels, progress_bar=False)
    calibrator.attach(model)
    yield model, pixels(data.test_images[:32]), calibrator
    calibrator.detach()


def test_torch_export_gives_the_calibrated_logits(calibrated):
    model, x, calibrator = calibrated
    with torch.no_grad():
        expected = model(pixel_values=x).logits
        program = torch.export.export(model, (), {"pixel_values": x})
        got = program.module()(pixel_values=x).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    raw = logits_of(calibrator.detach(), x)
    calibrator.attach(model)
    assert not torch.allclose(got, raw)  # the calibrator is in the exported program


def test_torch_compile_is_one_graph_with_the_same_outputs(calibrated):
    model, x, _ = calibrated
    graphs = []

    def count(gm, inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        expected = model(pixel_values=x).logits
        got = torch.compile(model, backend=count, fullgraph=True)(pixel_values=x).logits
        assert len(graphs) == 1  # a forward hook on the model was traced as a second graph
        explanation = torch._dynamo.explain(model)(pixel_values=x)
        assert explanation.graph_break_count == 0 and explanation.graph_count == 1
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)(pixel_values=x).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    torch.testing.assert_close(compiled, expected, rtol=0, atol=1e-6)

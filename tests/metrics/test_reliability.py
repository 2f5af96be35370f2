"""Reliability table (hand-worked) and diagrams, overall and per logit-margin group."""

import _metric_reference as ref
import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

from hf_calibration.metrics import ece, reliability_diagram, reliability_table


def _rows(confidences, k=4):
    c = np.asarray(confidences, dtype=np.float64)[:, None]
    return np.hstack([c, np.repeat((1 - c) / (k - 1), k - 1, axis=1)])


def test_table_hand_worked():
    # 5 bins; confidences .30 .35 .55 .90 .95, correct 0 1 1 1 0 (the ECE example of test_ece_functions)
    probs = _rows([0.30, 0.35, 0.55, 0.90, 0.95])
    target = np.array([1, 0, 0, 0, 2])
    table = reliability_table(probs, target, 5, from_logits=False)
    np.testing.assert_allclose(table.lower, [0, 0.2, 0.4, 0.6, 0.8], atol=1e-15)
    np.testing.assert_allclose(table.upper, [0.2, 0.4, 0.6, 0.8, 1.0], atol=1e-15)
    assert table.count.tolist() == [0, 2, 1, 0, 2]
    np.testing.assert_allclose(table.confidence, [np.nan, 0.325, 0.55, np.nan, 0.925], atol=1e-12)
    np.testing.assert_allclose(table.accuracy, [np.nan, 0.5, 1.0, np.nan, 0.5], atol=1e-12)
    np.testing.assert_allclose(table.gap, [np.nan, -0.175, -0.45, np.nan, 0.425], atol=1e-12)
    assert table.n == 5
    assert table.ece == pytest.approx(0.33, abs=1e-12)
    text = str(table)
    assert "32.50" in text and "92.50" in text and "ECE = 33.00" in text
    assert table.to_dict()["count"] == [0, 2, 1, 0, 2]


def test_table_matches_loop_bins():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2000, 10)) * 2
    target = rng.integers(0, 10, 2000)
    conf, correct = ref.top_label(ref.softmax(logits), target)
    table = reliability_table(logits, target)
    for b, (count, mean_conf, mean_acc) in enumerate(ref.loop_bins(conf, correct, 15)):
        assert table.count[b] == count
        if count:
            assert table.confidence[b] == pytest.approx(mean_conf, abs=1e-12)
            assert table.accuracy[b] == pytest.approx(mean_acc, abs=1e-12)
    assert table.ece == pytest.approx(ece(logits, target), abs=1e-12)


def _case(n=600, k=10, seed=0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, k)) * 2
    return logits, np.where(rng.random(n) < 0.6, logits.argmax(1), rng.integers(0, k, n))


def _panels(fig):
    """(reliability Axes, its count Axes) per panel, in drawing order (row-major)."""
    reliability = [a for a in fig.axes if a.get_ylabel() == "accuracy"]
    counts = [a for a in fig.axes if a.get_ylabel() == "count"]
    counts += [c for a in reliability for c in a.child_axes]  # insets under given Axes
    assert len(counts) == len(reliability)
    return list(zip(reliability, counts))


def _bars(ax, label):
    container = next(c for c in ax.containers if c.get_label() == label)
    return np.array([patch.get_height() for patch in container.patches])


def _text(ax):
    return " ".join(t.get_text() for t in ax.texts)


def _check_panel(rel_ax, count_ax, confidence, correct, n_bins=15):
    """The panel's bars against the loop reference on (confidence, correct): counts, accuracies, gaps."""
    bins = ref.loop_bins(confidence, correct, n_bins)
    np.testing.assert_array_equal(_bars(count_ax, "count"), [c for c, _, _ in bins])
    acc = _bars(rel_ax, "accuracy")
    gap = _bars(rel_ax, "gap")
    for b, (count, mean_conf, mean_acc) in enumerate(bins):
        if count:
            assert acc[b] == pytest.approx(mean_acc, abs=1e-12)
            assert gap[b] == pytest.approx(mean_conf - mean_acc, abs=1e-12)
        else:
            assert acc[b] == 0 and gap[b] == 0
    assert f"ECE = {100 * ref.loop_ece(confidence, correct, n_bins):.2f} %" in _text(rel_ax)
    assert f"N = {len(confidence)}" in _text(rel_ax)


def test_diagram_is_a_figure_and_saves(tmp_path):
    logits, target = _case()
    fig = reliability_diagram(torch.from_numpy(logits), torch.from_numpy(target), title="digits")
    assert isinstance(fig, Figure)
    ((rel_ax, count_ax),) = _panels(fig)
    assert rel_ax.get_title() == "digits"
    conf, correct = ref.top_label(ref.softmax(logits), target)
    _check_panel(rel_ax, count_ax, conf, correct)
    fig.savefig(tmp_path / "rd.png")
    assert (tmp_path / "rd.png").stat().st_size > 1000


def test_count_panel_equals_the_table_and_can_be_left_out():
    logits, target = _case(seed=3)
    table = reliability_table(logits, target, 10)
    ((rel_ax, count_ax),) = _panels(reliability_diagram(logits, target, 10))
    np.testing.assert_array_equal(_bars(count_ax, "count"), table.count)
    np.testing.assert_allclose(_bars(rel_ax, "accuracy"), np.nan_to_num(table.accuracy), atol=1e-12)
    bare = reliability_diagram(logits, target, 10, counts=False)
    assert len(bare.axes) == 1 and bare.axes[0].get_xlabel() == "confidence"


def test_margin_groups_split_by_logit_margin(tmp_path):
    logits, target = _case(n=601)
    fig = reliability_diagram(logits, target, margin_groups=3)
    panels = _panels(fig)
    assert len(panels) == 3
    # independent grouping: sort by top-1 minus top-2 logit, cut into 3 runs of 201/200/200
    top2 = np.sort(logits, axis=1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    order = np.argsort(margin, kind="stable")
    conf, correct = ref.top_label(ref.softmax(logits), target)
    for (rel_ax, count_ax), idx in zip(panels, np.array_split(order, 3)):
        _check_panel(rel_ax, count_ax, conf[idx], correct[idx])
        assert f"[{margin[idx].min():.2f}, {margin[idx].max():.2f}]" in rel_ax.get_title()
    fig.savefig(tmp_path / "groups.png")
    # the same groups from probabilities (detected): log p1 - log p2 is the logit margin
    fig_p = reliability_diagram(ref.softmax(logits), target, margin_groups=3)
    assert [a.get_title() for a, _ in _panels(fig_p)] == [a.get_title() for a, _ in panels]
    assert [_text(a) for a, _ in _panels(fig_p)] == [_text(a) for a, _ in panels]


def test_before_after_pair():
    logits, target = _case(seed=4)
    after = logits / 1.7
    fig = reliability_diagram(logits, target, calibrated=after, names=("uncalibrated", "TS"), title="pair")
    panels = _panels(fig)
    assert [a.get_title() for a, _ in panels] == ["uncalibrated", "TS"]
    assert fig.get_suptitle() == "pair"
    for (rel_ax, count_ax), z in zip(panels, (logits, after)):
        _check_panel(rel_ax, count_ax, *ref.top_label(ref.softmax(z), target))
    # probabilities after calibration are detected on their own
    fig_p = reliability_diagram(logits, target, calibrated=ref.softmax(after))
    assert [_text(a) for a, _ in _panels(fig_p)] == [_text(a) for a, _ in panels]


def test_before_after_pair_with_margin_groups_uses_the_same_samples_in_both_rows():
    logits, target = _case(n=600, seed=5)
    after = logits / np.linspace(0.5, 3.0, 600)[:, None]  # a per-sample temperature reorders margins
    fig = reliability_diagram(logits, target, calibrated=after, margin_groups=2)
    panels = _panels(fig)
    assert len(panels) == 4
    top2 = np.sort(logits, axis=1)[:, -2:]
    order = np.argsort(top2[:, 1] - top2[:, 0], kind="stable")  # the groups of the uncalibrated margins
    groups = np.array_split(order, 2)
    for row, z in enumerate((logits, after)):
        conf, correct = ref.top_label(ref.softmax(z), target)
        for col, idx in enumerate(groups):
            rel_ax, count_ax = panels[2 * row + col]
            _check_panel(rel_ax, count_ax, conf[idx], correct[idx])
            assert rel_ax.get_title().startswith(("uncalibrated", "calibrated")[row])


def test_tied_margins_share_a_group():
    # uniform rows all have margin 0: one group holds them all, the other is drawn empty
    probs = np.full((40, 4), 0.25)
    target = np.arange(40) % 4
    panels = _panels(reliability_diagram(probs, target, margin_groups=2))
    assert "N = 40" in _text(panels[0][0]) and _text(panels[1][0]) == "N = 0"
    assert "empty" in panels[1][0].get_title()
    assert _bars(panels[1][1], "count").sum() == 0


def test_diagram_draws_into_given_axes():
    logits, target = _case()
    fig = Figure()
    axes = fig.subplots(1, 2)
    assert reliability_diagram(logits, target, margin_groups=2, ax=axes) is fig
    single = Figure().subplots()
    assert reliability_diagram(logits, target, ax=single) is single.figure
    ((rel_ax, count_ax),) = _panels(single.figure)  # the counts go in an inset under the given Axes
    assert rel_ax is single
    _check_panel(rel_ax, count_ax, *ref.top_label(ref.softmax(logits), target))
    with pytest.raises(ValueError, match="`ax`"):
        reliability_diagram(logits, target, margin_groups=3, ax=axes)
    with pytest.raises(ValueError, match="`ax` to hold 2 Axes"):  # a pair needs two
        reliability_diagram(logits, target, calibrated=logits / 2, ax=single)
    pair = Figure().subplots(1, 2)
    reliability_diagram(logits, target, calibrated=logits / 2, ax=pair, counts=False)
    assert [a.get_title() for a in pair] == ["uncalibrated", "calibrated"]


@pytest.mark.parametrize("bad,err", [(0, ValueError), (2.0, TypeError), (10_000, ValueError)])
def test_bad_margin_groups(bad, err):
    logits, target = _case()
    with pytest.raises(err, match="margin_groups"):
        reliability_diagram(logits, target, margin_groups=bad)


# ------------------------------------------------------------------ as a person reads them


def _render(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer(), np.asarray(canvas.buffer_rgba())[..., :3].astype(float)


def _legend(fig, ax):
    legend = fig.legends[0] if fig.legends else ax.get_legend()
    return {text.get_text(): handle for text, handle in zip(legend.get_texts(), legend.legend_handles)}


def _binary(confidence, correct):
    """Two-class probabilities whose top label has these confidences (>= 0.5) and correctness."""
    confidence = np.asarray(confidence, dtype=np.float64)
    probs = np.stack([confidence, 1 - confidence], axis=1)
    return probs, np.where(np.asarray(correct, dtype=bool), 0, 1)


def _mixed_case():
    """Bin (0.5, 0.6] under-confident (conf 0.55, all right), (0.9, 1.0] over-confident (conf 0.95, 60 % right),
    (0.7, 0.8] holding only 2 samples."""
    conf = [0.55] * 200 + [0.95] * 300 + [0.75] * 2
    correct = [1] * 200 + [1] * 180 + [0] * 120 + [1, 0]
    return _binary(conf, correct)


def test_summary_label_is_clear_of_the_bars():
    rng = np.random.default_rng(0)
    confidence = rng.uniform(0.5, 1.0, 3000)  # every bin from 0.5 up holds a tall bar
    probs, labels = _binary(confidence, rng.random(3000) < confidence - 0.05)
    fig = reliability_diagram(probs, labels)
    renderer, _ = _render(fig)
    ((rel_ax, _),) = _panels(fig)
    label = next(t for t in rel_ax.texts if "ECE" in t.get_text())
    box = label.get_window_extent(renderer)
    bars = [p for p in rel_ax.patches if p.get_height() != 0]
    assert bars and not any(box.overlaps(p.get_window_extent(renderer)) for p in bars)


def test_gap_colours_on_screen_are_the_legend_colours():
    """What the eye sees in an under- and an over-confident gap (the median rendered pixel inside it) is the
    colour of the legend entry that names it."""
    probs, labels = _mixed_case()
    fig = reliability_diagram(probs, labels, 10)
    ((rel_ax, _),) = _panels(fig)
    renderer, pixels = _render(fig)
    handles = _legend(fig, rel_ax)
    gaps = next(c for c in rel_ax.containers if c.get_label() == "gap").patches
    height = pixels.shape[0]
    for kind, b in (("under", 5), ("over", 9)):
        box = gaps[b].get_window_extent(renderer)
        inside = pixels[int(height - box.y1) + 3 : int(height - box.y0) - 3, int(box.x0) + 3 : int(box.x1) - 3]
        seen = np.median(inside.reshape(-1, 3), axis=0)
        handle = next((h for label, h in handles.items() if kind in label), handles.get("gap"))
        r, g, bl, alpha = handle.get_facecolor()
        shown = 255 * (alpha * np.array([r, g, bl]) + (1 - alpha))  # the legend's swatch over its white background
        assert np.abs(seen - shown).max() < 12, (kind, seen, shown)


def test_count_panel_log_scale_and_thin_bins_marked():
    probs, labels = _mixed_case()
    fig = reliability_diagram(probs, labels, 10, count_scale="log")
    ((rel_ax, count_ax),) = _panels(fig)
    assert count_ax.get_yscale() == "log" and count_ax.get_ylim()[0] < 1  # a bin of 1 sample is a visible bar
    assert _panels(reliability_diagram(probs, labels, 10))[0][1].get_yscale() == "linear"
    # the bin (0.7, 0.8] holds 2 samples: its count is written in the count panel, its bars are faded
    notes = [t for t in count_ax.texts if t.get_text() == "2"]
    assert len(notes) == 1 and notes[0].xy[0] == pytest.approx(0.75)
    bars = next(c for c in rel_ax.containers if c.get_label() == "accuracy").patches
    assert bars[7].get_alpha() is not None and bars[7].get_alpha() < 1
    assert bars[5].get_alpha() in (None, 1.0)  # 200 samples: drawn as usual
    assert any("fewer than 10" in label for label in _legend(fig, rel_ax))
    assert not [t for t in _panels(reliability_diagram(probs, labels, 10, min_count=0))[0][1].texts]
    with pytest.raises(ValueError, match="count_scale"):
        reliability_diagram(probs, labels, count_scale="symlog")


@pytest.mark.parametrize("layout", ["single", "pair", "margin_groups"])
def test_titles_and_legend_stay_inside_the_figure(layout):
    title = "/home/someone/experiments/cifar10/" * 3 + "logits.npz[val]: temperature_scaling (held-out folds)"
    logits, target = _case()
    kwargs = {"single": {}, "pair": {"calibrated": logits / 2}, "margin_groups": {"margin_groups": 3}}[layout]
    fig = reliability_diagram(logits, target, title=title, **kwargs)
    renderer, _ = _render(fig)
    width, height = fig.bbox.width, fig.bbox.height
    texts = (
        [a.title for a in fig.axes if a.get_title()] + ([fig._suptitle] if fig._suptitle else []) + list(fig.legends)
    )
    assert any(
        t.get_text().replace("\n", "").replace(" ", "") == title.replace(" ", "")
        for t in texts
        if hasattr(t, "get_text")
    )
    for artist in texts:
        box = artist.get_window_extent(renderer)
        assert box.x0 >= -1 and box.x1 <= width + 1 and box.y0 >= -1 and box.y1 <= height + 1, (
            artist,
            box,
            width,
            height,
        )


def test_per_bin_interval_is_the_wilson_interval():
    from scipy.stats import binomtest

    from hf_calibration.metrics.reliability import wilson_interval

    for k, n in [(7, 10), (0, 3), (3, 3), (450, 1000)]:
        low, high = wilson_interval(np.array([n]), np.array([k / n]), 0.9)
        expected = binomtest(k, n).proportion_ci(confidence_level=0.9, method="wilson")
        assert (low[0], high[0]) == pytest.approx((expected.low, expected.high), abs=1e-12)
    probs, labels = _mixed_case()
    table = reliability_table(probs, labels, 10, ci=0.95)
    expected = binomtest(180, 300).proportion_ci(confidence_level=0.95, method="wilson")
    assert (table.accuracy_low[9], table.accuracy_high[9]) == pytest.approx((expected.low, expected.high), abs=1e-12)
    assert "acc low" in str(table) and table.to_dict()["accuracy_high"][9] == table.accuracy_high[9]
    assert reliability_table(probs, labels, 10).accuracy_low is None  # the default table is unchanged
    # the diagram draws exactly these intervals as error bars, and the ECE with its bootstrap interval
    fig = reliability_diagram(probs, labels, 10)
    ((rel_ax, _),) = _panels(fig)
    (bars,) = [c for c in rel_ax.containers if c.get_label() == "interval"]
    segments = bars.lines[2][0].get_segments()
    filled = np.flatnonzero(table.count > 0)
    ends = {round(float(seg[0][0]), 6): (seg[0][1], seg[1][1]) for seg in segments}
    for b in filled:
        lo, hi = ends[round(float((table.lower[b] + table.upper[b]) / 2), 6)]
        assert (lo, hi) == pytest.approx((table.accuracy_low[b], table.accuracy_high[b]), abs=1e-12)
    value = ece(probs, labels, 10, ci=0.95)
    assert f"ECE = {value.format(100, 2, ' %')}" in _text(rel_ax)


# --- every table and diagram a user can draw: intervals bracket their estimate, error bars are never negative

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


@st.composite
def _diagram_case(draw):
    """Random (N, K) logits with all-right / all-wrong bins, exact ties and rounded rows, as the demo makes them.

    Rounded logits can look like probability rows (``[0.6, 0.4]``), so the tests say ``from_logits=True``.
    """
    n = draw(st.integers(1, 60))
    k = draw(st.integers(2, 6))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(["continuous", "tied", "separable", "all_wrong"]))
    logits = rng.normal(size=(n, k)) * draw(st.sampled_from([0.5, 2.0, 8.0]))
    if kind == "tied":  # few distinct rows: every bin holds copies of one confidence
        logits = logits[rng.integers(0, min(n, 3), n)].round(1)
    target = rng.integers(0, k, n)
    if kind == "separable":  # every prediction right
        target = logits.argmax(1)
    elif kind == "all_wrong":
        target = (logits.argmax(1) + 1) % k
    return logits, target, draw(st.integers(1, 20))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_diagram_case(), level=st.sampled_from([0.5, 0.9, 0.95, 0.99]))
def test_table_intervals_bracket_their_estimate(case, level):
    logits, target, n_bins = case
    table = reliability_table(logits, target, n_bins, ci=level, from_logits=True)
    filled = table.count > 0
    acc, low, high = table.accuracy[filled], table.accuracy_low[filled], table.accuracy_high[filled]
    assert (low <= acc).all() and (acc <= high).all() and (low >= 0).all() and (high <= 1).all()
    assert np.isnan(table.accuracy_low[~filled]).all()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_diagram_case(), layout=st.sampled_from(["single", "pair", "margin_groups"]))
def test_every_diagram_draws(case, layout):
    import matplotlib.pyplot as plt

    logits, target, n_bins = case
    # at most one group per sample: two groups of one sample are refused, rightly (seen with N = 1)
    kwargs = {
        "single": {},
        "pair": {"calibrated": logits / 3},
        "margin_groups": {"margin_groups": min(2, len(target))},
    }[layout]
    fig = reliability_diagram(logits, target, n_bins, n_boot=50, from_logits=True, **kwargs)
    try:
        fig.canvas.draw()
    finally:
        plt.close(fig)


@pytest.mark.parametrize("correct", [0, 1])
@pytest.mark.parametrize("count", [7, 10, 13, 25, 118])
def test_wilson_interval_of_an_all_right_or_all_wrong_bin_is_exact(count, correct):
    from hf_calibration.metrics.reliability import wilson_interval

    low, high = wilson_interval(np.array([count]), np.array([float(correct)]), 0.95)
    assert (low[0] == 0.0) if correct == 0 else (high[0] == 1.0)
    P = np.tile([[0.9, 0.1]], (count, 1))
    fig = reliability_diagram(P, np.full(count, 1 - correct), n_boot=50)  # the example crashed here
    fig.canvas.draw()


def test_calibrated_with_another_k_blames_calibrated():
    """Issue 29 item 11: a ``calibrated=`` array with another K blamed ``target``, and was accepted when the labels
    happened to fit its K."""
    rng = np.random.default_rng(0)
    target = rng.integers(0, 3, 60)
    logits = rng.normal(size=(60, 5))
    for other in (rng.normal(size=(60, 3)), rng.normal(size=(60, 4)), rng.normal(size=(59, 5))):
        with pytest.raises(ValueError, match=r"`calibrated` to have the shape of `preds` \(60, 5\)"):
            reliability_diagram(logits, target, calibrated=other)

"""Cost model (costs.py), acceptance model (acceptance_model.py) and the measured speed-up (speedup.py)."""

from __future__ import annotations

import json

import pytest

from spectui.engine.acceptance_model import AcceptanceModel, prob_bin
from spectui.engine.costs import DRAFT_CLIP, EMA, PRIOR, WINDOW, CostKey, CostModel, cache_path
from spectui.engine.speedup import MAX_AGE, MAX_PREFIX_GAP, MIN_PURE, PureSteps, SpeedupMeter


def model() -> CostModel:
    return CostModel({1: 47.0, 2: 54.0, 4: 67.0, 8: 77.0}, prefix_len=160)


def test_verify_cost_interpolates_extrapolates_and_follows_real_steps():
    costs = model()
    assert costs.verify(1) == 47 and costs.verify(3) == pytest.approx(60.5)
    assert costs.verify(16) == pytest.approx(77 + 8 * 10 / 4)  # the last slope, extended
    for _ in range(WINDOW):
        costs.observe_verify(1, 2 * 47.0)  # the machine got twice as slow
    assert costs.verify(1) == pytest.approx(94) and costs.verify(8) == pytest.approx(154)
    costs.observe_verify(1, 1000.0)  # one wild step moves nothing: medians
    assert costs.verify(1) == pytest.approx(94)
    for _ in range(WINDOW):
        costs.observe_verify(6, 2 * 90.0)  # a tree of 6 costs more than the table said: the shape moves
    assert costs.verify(6) == pytest.approx(180)
    assert costs.verify(8) >= costs.verify(6) and costs.verify(1) == pytest.approx(94)  # non-decreasing; c1 kept


def test_wild_steps_at_a_new_tree_size_do_not_stick():
    """A stalled step at a size the load did not time must not set that size's cost (nor, through
    the non-decreasing curve, every larger size's): trees that size would never be chosen again."""
    costs = model()
    before = {t: costs.verify(t) for t in (9, 12, 16)}
    for _ in range(PRIOR - 1):
        costs.observe_verify(9, 1500.0)
    assert {t: costs.verify(t) for t in (9, 12, 16)} == pytest.approx(before)
    for _ in range(WINDOW):
        costs.observe_verify(9, 160.0)  # a real change, step after step, still moves it
    assert costs.verify(9) == pytest.approx(160.0) and costs.verify(16) >= 160.0


def test_a_stalled_draft_forward_moves_its_cost_a_little():
    costs = model()
    costs.observe_draft("head", 2.5)
    costs.observe_draft("head", 80.0)  # one stall
    assert costs.draft("head") == pytest.approx(2.5 + EMA * (DRAFT_CLIP - 1) * 2.5)
    for _ in range(40):
        costs.observe_draft("head", 6.0)  # really dearer now: followed
    assert costs.draft("head") == pytest.approx(6.0, rel=0.02)


def test_cache_round_trip_and_key_mismatch(tmp_path):
    key = CostKey("m", "nf4", "cpu", 2)
    path = cache_path(tmp_path, key)
    costs = model()
    costs.draft_ms["ssm"] = 3.0
    costs.save(path, key)
    back = CostModel.load(path, key)
    assert back is not None and back.from_cache and back.verify_table == costs.verify_table and back.draft_ms == {"ssm": 3.0}
    assert CostModel.load(path, CostKey("m", "nf4", "cpu", 1)) is None  # other thread count: re-measure
    assert cache_path(tmp_path, CostKey("m", "nf4", "cpu", 1)) != path
    other_kernel = CostKey("m", "nf4", "cpu", 2, linear4bit="spectui 4-bit kernel (AVX2, 210 layers)")
    assert CostModel.load(path, other_kernel) is None  # other 4-bit path: other costs, re-measure
    path.write_text("{not json", encoding="utf-8")
    assert CostModel.load(path, key) is None
    path.write_text(json.dumps({"version": 1, "key": {}, "verify_ms": {"1": -1}}), encoding="utf-8")
    assert CostModel.load(path, key) is None


def test_acceptance_model_learns_and_reports_calibration():
    acc = AcceptanceModel(kinds={"ssm": "model", "ngram": "ngram"})
    high, low = prob_bin(0.95), prob_bin(0.15)
    assert acc.predict({"ssm": high}, 1) > acc.predict({"ssm": low}, 1)  # the prior follows q
    before = acc.predict({"ngram": 4}, 2)
    for _ in range(50):
        acc.observe({"ngram": 4}, 2, True)
    assert acc.predict({"ngram": 4}, 2) > 0.9 > before
    for k in range(40):
        acc.observe({"ssm": high}, 1, k % 4 == 0)  # observed 25 %
    assert acc.predict({"ssm": high}, 1) == pytest.approx((10 + 4 * 0.57) / 44)
    assert acc.predict({"ssm": high, "ngram": 4}, 2) == acc.predict({"ngram": 4}, 2)  # best of its speculators
    assert acc.mean_for("ssm", 1) == pytest.approx((10 + 4 * 0.57) / 44)
    acc.observe({"ssm": low}, 1, True)  # a new trial in another bin moves the depth's mean at once
    assert acc.mean_for("ssm", 1) == pytest.approx((11 + 4 * 0.57) / 45)
    rows = {(r["speculator"], r["depth_from"]): r for r in acc.calibration()}
    assert rows[("ssm", 1)]["observed"] == 0.25 and rows[("ssm", 1)]["trials"] == 40
    assert 0.25 < rows[("ssm", 1)]["predicted"] < 0.57  # predictions moved from the prior toward 25 %


def test_calibration_after_a_reload_counts_only_this_process_predictions(tmp_path):
    first = AcceptanceModel(kinds={"ngram": "ngram"})
    for _ in range(60):
        first.observe({"ngram": 8}, 1, True)
    first.save(tmp_path / "acc.json")
    second = AcceptanceModel(kinds={"ngram": "ngram"})
    assert second.load(tmp_path / "acc.json") and second.calibration() == []  # nothing predicted here yet
    for _ in range(10):
        second.observe({"ngram": 8}, 1, True)
    (row,) = second.calibration()
    assert row["trials"] == 10 and row["observed"] == 1.0
    assert row["predicted"] > 0.9  # the reloaded cell already predicted it; not diluted by the loaded trials


def test_speedup_is_one_for_pure_steps_and_measured_otherwise():
    meter = SpeedupMeter()
    for ms in (50.0, 61.0, 47.0):
        meter.add(1, ms, pure=True, reference_ms=None)
    assert meter.speedup == 1.0
    meter.add(3, 80.0, pure=False, reference_ms=50.0)  # 3 tokens that incremental decoding takes 150 ms for
    assert meter.speedup == pytest.approx((158 + 150) / (158 + 80))
    blind = SpeedupMeter()
    blind.add(2, 60.0, pure=False, reference_ms=None)
    assert blind.speedup is None  # never a guess


def test_pure_steps_ask_for_calibration_when_stale():
    pure = PureSteps()
    for _ in range(MIN_PURE):
        assert pure.needs_calibration(100)  # one timed step is not a reference to trust yet
        pure.record(100, 50.0, pure=True)
    assert not pure.needs_calibration(100)
    assert pure.needs_calibration(100 + MAX_PREFIX_GAP + 1)
    for _ in range(MAX_AGE):
        pure.record(100, 80.0, pure=False)
    assert pure.needs_calibration(100)
    assert pure.reference_ms(100) == 50.0
    assert pure.reference_ms(100 + MAX_PREFIX_GAP + 1) is None  # timed at another prefix: not a reference

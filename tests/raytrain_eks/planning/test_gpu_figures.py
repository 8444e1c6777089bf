"""The rates of the step-time model: the published L4 table by shape, the calibration file that
``make gpu-check`` writes replacing them, and one-line refusals of a file that cannot be used."""
from __future__ import annotations

import json

import pytest

from raytrain_eks.planning.gpu_figures import L4_GEMM_TFLOPS, CalibrationError, calibrated, figures_for, published


def test_a_gemm_takes_the_rates_of_the_table_entries_that_bracket_its_size():
    f = published("L4", 40)
    assert f.gemm_rate(2048, 2048, 2048) == (70.9, 70.9)
    assert f.gemm_rate(3000, 3000, 3000) == (54.9, 70.9)          # between 2048 and 4096
    assert f.gemm_rate(20000, 20000, 20000) == (59.4, 59.4)       # beyond the table: its last entry
    low, high = f.gemm_rate(512, 512, 512)                        # below: in proportion to the size
    assert (low, high) == pytest.approx((54.4 / 2, 54.4 / 2))


def test_published_figures_name_what_is_assumed():
    f = published("L4", 40)
    assert f.assumed() == ["gemm", "memory", "kernel_floor_us", "pcie", "efa"]
    assert (f.efa.low, f.efa.high) == (3.0, 5.0) and "issue 547" in f.efa.source
    assert "issue 120" in f.gemm.source and "cube-root size (assumed)" in f.gemm.source
    other = published("A10G", 40)  # no table of its own: the L4's efficiency on its peak, assumed
    assert other.gemm.assumed and other.gemm_rate(2048, 2048, 2048) == pytest.approx((70.9 * 70 / 121,) * 2)


def _write(path, **overrides):
    data = {"gpu": "L4", "measured_at": "2026-12-03T08:00:00+00:00",
            "gemm": [{"m": 2048, "n": 1536, "k": 8960, "tflops": 48.0}, {"m": 4096, "n": 4096, "k": 4096, "tflops": 60.0}],
            "memory_gbytes_per_s": 251.0, "step": {"step_s": 6.1}}
    data.update(overrides)
    path.write_text(json.dumps(data))
    return path


def test_a_calibration_replaces_the_published_and_assumed_rates(tmp_path):
    f = figures_for("L4", 40, _write(tmp_path / "c.json"))
    assert f.gemm_rate(2048, 1536, 8960) == (48.0, 48.0)
    assert (f.memory.low, f.memory.high) == (251.0, 251.0) and "make gpu-check" in f.memory.source
    assert f.assumed() == ["kernel_floor_us", "pcie", "efa"] and f.measured_step == {"step_s": 6.1}


def test_no_calibration_or_one_of_another_gpu_changes_nothing(tmp_path):
    base = published("L4", 40)
    assert calibrated(base, tmp_path / "absent.json") == base
    assert calibrated(base, _write(tmp_path / "c.json", gpu="L40S")) == base
    assert base.gemm_tflops == {(s, s, s): rate for s, rate in L4_GEMM_TFLOPS.items()}


@pytest.mark.parametrize("overrides, message", [
    ({"gpu": None}, "gpu = None: must name the GPU model"),
    ({"gemm": []}, "gemm = []: must be a non-empty list"),
    ({"gemm": [{"m": 2, "n": 2, "k": 2, "tflops": -1}]}, "gemm[0].tflops = -1: must be a number > 0"),
    ({"memory_gbytes_per_s": "fast"}, "memory_gbytes_per_s = 'fast': must be a number > 0"),
    ({"step": {"tokens_per_s": 3}}, "step = {'tokens_per_s': 3}: must be an object with step_s"),
])
def test_a_bad_calibration_is_refused_in_one_line_naming_file_and_field(tmp_path, overrides, message):
    path = _write(tmp_path / "c.json", **overrides)
    with pytest.raises(CalibrationError) as err:
        calibrated(published("L4", 40), path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value) and "\n" not in str(err.value)


def test_a_calibration_that_is_not_json_is_refused(tmp_path):
    path = tmp_path / "c.json"
    path.write_text("{")
    with pytest.raises(CalibrationError, match="not JSON"):
        calibrated(published("L4", 40), path)


def test_calibrated_shapes_of_equal_volume_keep_their_own_rates(tmp_path):
    """The trace's GEMMs come in transposed triples of one volume (a projection's forward, its
    input gradient and its weight gradient: (2048, 1536, 8960), (2048, 8960, 1536),
    (8960, 1536, 2048)); each was measured at its own rate and keeps it."""
    rows = [{"m": 2048, "n": 1536, "k": 8960, "tflops": 48.0}, {"m": 2048, "n": 8960, "k": 1536, "tflops": 52.0},
            {"m": 8960, "n": 1536, "k": 2048, "tflops": 41.0}, {"m": 4096, "n": 4096, "k": 4096, "tflops": 60.0}]
    f = figures_for("L4", 40, _write(tmp_path / "c.json", gemm=rows))
    assert [f.gemm_rate(r["m"], r["n"], r["k"]) for r in rows] == [(r["tflops"], r["tflops"]) for r in rows]
    # an unmeasured shape of that volume spans all three; one between the sizes, both neighbours'
    assert f.gemm_rate(1536, 2048, 8960) == (41.0, 52.0)
    assert f.gemm_rate(3500, 3500, 3500) == (41.0, 60.0)

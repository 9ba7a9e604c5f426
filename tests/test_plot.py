"""fitcheck plot: PNG and SVG written, the capacity line and the stack drawn, clear errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from test_advisor_fakes import fake_estimate, llama8b_spec

from fitcheck.advice.series import micro_batch_points, seq_len_points
from fitcheck.errors import ConfigError
from fitcheck.render.plot import plot_report

pytest.importorskip("matplotlib")


def test_png_and_svg_are_written_with_capacity_and_components(tmp_path: Path) -> None:
    spec = llama8b_spec(micro=4, seq=4096, gas=4)
    report = fake_estimate(spec)
    png = plot_report(report, tmp_path / "m.png", estimate_fn=fake_estimate)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = plot_report(report, tmp_path / "m.svg", estimate_fn=fake_estimate).read_text()
    assert "GPU capacity 80.0 GiB" in svg
    assert "activations: 68.00 GiB" in svg  # the component stack at the run's own setting
    assert "does not fit" in svg


def test_bad_suffix_and_missing_matplotlib_are_config_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = fake_estimate(llama8b_spec())
    with pytest.raises(ConfigError, match=r"\.png or \.svg"):
        plot_report(report, tmp_path / "m.pdf", estimate_fn=fake_estimate)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ConfigError, match=r"fitcheck\[plot\]"):
        plot_report(report, tmp_path / "m.png", estimate_fn=fake_estimate)


def test_points_cover_the_run_and_the_limit() -> None:
    pts = micro_batch_points(4, 100)
    assert 4 in pts and 100 in pts and 101 in pts and len(pts) <= 40
    assert micro_batch_points(2, 3) == list(range(1, 9))
    assert 4096 in seq_len_points(4096) and 8192 in seq_len_points(4096) and 3000 in seq_len_points(3000)

"""The one SVG plotting helper (smolforge/svg_plot.py): ticks, scales, escaping, valid XML, pixels."""
from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

import pytest

from smolforge.svg_plot import (Band, Column, Layout, Mark, Scale, Series, bar_chart, escape, line_chart, nice_ticks,
                                padded, strip_chart, tag, thin)

SVG = "{http://www.w3.org/2000/svg}"
NASTY = 'a<b & "c" > \'d\''


# --------------------------------------------------------------------------- ticks


@pytest.mark.parametrize("lo,hi,n,expected", [
    (0, 1, 5, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]),
    (0.2, 0.9, 3, [0.25, 0.5, 0.75]),
    (0, 1000, 5, [0.0, 200.0, 400.0, 600.0, 800.0, 1000.0]),
    (1.3, 9.1, 4, [2.0, 4.0, 6.0, 8.0]),
    (0.123, 0.129, 3, [0.124, 0.126, 0.128]),
    (-3, 2, 5, [-3.0, -2.0, -1.0, 0.0, 1.0, 2.0]),
    (-0.7, -0.1, 3, [-0.6, -0.4, -0.2]),
    (-1, 1, 4, [-1.0, -0.5, 0.0, 0.5, 1.0]),
    (2, 0, 2, [0.0, 1.0, 2.0]),                     # bounds in either order
])
def test_linear_ticks_are_round_and_cover_the_range(lo, hi, n, expected):
    assert nice_ticks(lo, hi, n) == expected


def test_a_single_value_range_is_its_own_tick():
    assert nice_ticks(4.0, 4.0) == [4.0]
    assert nice_ticks(-0.5, -0.5) == [-0.5]
    assert nice_ticks(1e-3, 1e-3, log=True) == [1e-3]


@pytest.mark.parametrize("lo,hi,n,expected", [
    (1e-6, 1.0, 6, [1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1.0]),  # every decade
    (3e-4, 0.5, 5, [1e-3, 1e-2, 0.1]),                        # only the decades inside
    (1e-8, 10.0, 5, [1e-8, 1e-6, 1e-4, 1e-2, 1.0]),           # every second decade
    (1.0, 1e12, 5, [1.0, 1e5, 1e10]),                          # never 2.5 decades apart
])
def test_log_ticks_are_powers_of_ten(lo, hi, n, expected):
    ticks = nice_ticks(lo, hi, n, log=True)
    assert ticks == pytest.approx(expected, rel=1e-12)
    assert all(math.log10(t) == round(math.log10(t)) for t in ticks)


def test_a_log_scale_refuses_non_positive_bounds():
    with pytest.raises(ValueError, match="positive bounds"):
        nice_ticks(0.0, 1.0, log=True)


def test_padding_and_thinning():
    assert padded(0.0, 10.0) == (-0.5, 10.5)
    assert padded(-2.0, -2.0) == (-2.2, -1.8) and padded(0.0, 0.0) == (-1.0, 1.0)
    points = [(float(i), float(i)) for i in range(2000)]
    thinned = thin(points)
    assert len(thinned) == 600 and thinned[0] == points[0] and thinned[-1] == points[-1]


# --------------------------------------------------------------------------- scales and elements


def test_scales_map_data_to_pixels():
    assert Scale(0, 10, 100, 200)(0) == 100 and Scale(0, 10, 100, 200)(10) == 200
    up = Scale(-1, 1, 300, 100)                        # a y axis: larger values higher up
    assert (up(-1), up(0), up(1)) == (300, 200, 100)
    assert up(5) == -300 and Scale(-1, 1, 300, 100, clamp=True)(5) == 100
    log = Scale(1e-4, 1.0, 0, 400, log=True)
    assert log(1e-3) == pytest.approx(100) and log(1e-2) == pytest.approx(200)
    assert log.ticks(4) == pytest.approx([1e-4, 1e-3, 1e-2, 0.1, 1.0])


def test_labels_are_escaped():
    assert escape(NASTY) == "a&lt;b &amp; &quot;c&quot; &gt; &#x27;d&#x27;"
    element = tag("text", escape(NASTY), data_label=NASTY, title=NASTY)
    parsed = ET.fromstring(element)
    assert parsed.get("data-label") == NASTY and parsed.find("title").text == NASTY
    assert parsed.find("title").tail == NASTY  # the text itself, after its tooltip


# --------------------------------------------------------------------------- charts


def _charts() -> dict[str, str]:
    return {
        "line": line_chart(NASTY, [Series(NASTY, [(1, 2.0), (2, float("nan")), (3, 1.0)]), Series("b", [(2, 1.5)])],
                           xlabel=NASTY, ylabel=NASTY, marks=[Mark(NASTY, 2, "#000")], band=Band(NASTY, 1.5, 2.5)),
        "log": line_chart("lr", [Series("loss", [(1e-4, 3.0), (1e-2, 2.0), (1.0, 9.0)])], log_x=True,
                          layout=Layout(standalone=True, kind="lr-find")),
        "bar": bar_chart(NASTY, [NASTY, "b"], [(NASTY, [{"value": 0.5, "stderr": 0.1, "random": 0.25}, None]),
                                               ("two", [{"value": -0.2}, {"value": 3.0, "stderr": 0.5}])]),
        "strip": strip_chart(NASTY, [Column(NASTY, [0.5, 0.52], 0.51, 0.01, NASTY), Column("empty", [])]),
    }


@pytest.mark.parametrize("kind", ["line", "log", "bar", "strip"])
def test_every_chart_parses_as_svg_with_its_labels_intact(kind):
    svg = _charts()[kind]
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg" and root.get("role") == "img" and "plot" in root.get("class").split()
    width, height = (float(v) for v in root.get("viewBox").split()[2:])
    assert (width, height) == (float(root.get("width")), float(root.get("height")))
    if kind != "log":
        texts = ["".join(e.itertext()) for e in root.iter() if e.tag in (f"{SVG}text", f"{SVG}title")]
        assert NASTY in texts and root.get("data-title") == NASTY
        assert "<b &" not in svg


def test_a_polyline_maps_data_to_pixels_as_computed_by_hand():
    # plot area: x 50..150, y 125 (bottom) .. 25 (top); domain x 0..10, y 0..100
    layout = Layout(width=200, height=150, left=50, right=50, top=25, bottom=25)
    svg = line_chart("t", [Series("s", [(0, 0.0), (5, 50.0), (10, 100.0), (2.5, 80.0)], markers=False)],
                     x_range=(0, 10), y_range=(0, 100), layout=layout)
    points = re.search(r'<polyline points="([^"]+)"', svg).group(1)
    assert points == "50,125 100,75 150,25 75,45"
    assert "<circle" not in svg


def test_a_log_x_polyline_and_clipping():
    layout = Layout(width=200, height=150, left=50, right=50, top=25, bottom=25)
    svg = line_chart("t", [Series("s", [(1e-3, 0.0), (1e-2, 5.0), (1e-1, 50.0)])], log_x=True,
                     x_range=(1e-3, 1e-1), y_range=(0, 10), layout=layout)
    assert re.search(r'<polyline points="([^"]+)"', svg).group(1) == "50,125 100,75 150,25"  # 50 clipped to 10
    assert svg.count("<circle") == 3                                                         # short: a dot each


def test_line_chart_parts_legend_and_marks():
    svg = _charts()["line"]
    root = ET.fromstring(svg)
    groups = root.findall(f"{SVG}g[@class='series']")
    assert [g.get("data-series") for g in groups] == [NASTY, "b"]
    assert len(groups[0].findall(f"{SVG}polyline")) == 1 and len(groups[0].findall(f"{SVG}circle")) == 2  # nan left out
    assert len(groups[1].findall(f"{SVG}polyline")) == 0 and len(groups[1].findall(f"{SVG}circle")) == 1
    assert svg.count('class="mark"') == 1 and svg.count('class="band"') == 1
    legend = [e.text for e in root.iter(f"{SVG}text") if e.get("class") == "legend"]
    assert legend == [NASTY[:24], "b", NASTY[:24], NASTY[:24]]  # series, marks, band


def test_bar_chart_bars_error_bars_and_baselines():
    svg = _charts()["bar"]
    assert svg.count('class="bar"') == 3 and svg.count('class="errbar"') == 2 and svg.count('class="baseline"') == 1
    assert 'data-stderr="0.1"' in svg and 'data-random="0.25"' in svg and 'data-value="-0.2"' in svg
    root = ET.fromstring(svg)
    bars = [e for e in root.iter(f"{SVG}rect") if e.get("class") == "bar"]
    zero_row = [float(b.get("y")) + float(b.get("height")) for b in bars if float(b.get("data-value")) > 0]
    assert max(zero_row) - min(zero_row) < 0.02          # positive bars all stand on the zero line


def test_strip_chart_dots_means_and_spreads():
    svg = _charts()["strip"]
    assert svg.count('class="seed"') == 2 and svg.count('class="mean"') == 1 and svg.count('class="spread"') == 1
    assert "empty" in svg

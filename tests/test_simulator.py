"""The simulator draws, and moving a slider changes what it shows."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from specdec.viz.simulator import Scenario, draw, simulator, summary  # noqa: E402


def test_draw_makes_three_panels():
    fig = draw(Scenario())
    assert len(fig.axes) == 3
    plt.close(fig)


def test_summary_reports_the_speedup():
    assert "speedup 2.80x" in summary(Scenario(a=0.8, gamma=4, c=0.05))
    assert summary(Scenario(batch=1024)) != summary(Scenario(batch=1))


def test_moving_the_gamma_slider_changes_the_readout():
    app = simulator()
    sliders = {w.description: w for box in app.children[0].children for w in box.children}
    readout = app.children[1]
    before = readout.value
    sliders["draft length gamma"].value = 8
    assert readout.value != before and "speedup 3.09x" in readout.value
    sliders["GPU preset"].value = "L4"
    assert sliders["bandwidth (GB/s)"].value == 300
    plt.close("all")

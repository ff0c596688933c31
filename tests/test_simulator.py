"""The simulator draws, and moving a slider changes what it shows; a burst of moves renders once, for the last value."""

import asyncio
import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from specdec import ledger  # noqa: E402
from specdec.viz import simulator as simulator_module  # noqa: E402
from specdec.viz.simulator import Scenario, draw, simulator, summary  # noqa: E402


def sliders(app) -> dict:
    return {w.description: w for box in app.children[0].children for w in box.children}


def test_draw_makes_three_panels():
    fig = draw(Scenario())
    assert len(fig.axes) == 3
    plt.close(fig)


def test_summary_reports_the_speedup():
    assert "speedup 2.80x" in summary(Scenario(a=0.8, gamma=4, c=0.05))
    assert summary(Scenario(batch=1024)) != summary(Scenario(batch=1))


def test_moving_the_gamma_slider_changes_the_readout():
    app = simulator()
    controls = sliders(app)
    readout = app.children[1]
    before = readout.value
    controls["draft length gamma"].value = 8
    assert readout.value != before and "speedup 3.09x" in readout.value
    controls["GPU preset"].value = "L4"
    assert controls["bandwidth (GB/s)"].value == 300
    plt.close("all")


def test_a_burst_of_slider_moves_is_drawn_once_for_the_last_value(monkeypatch):
    """In a running event loop (as in a kernel) three quick moves give one render, for the last value, and the
    line, the panel titles and the panels' caption all describe that value."""
    drawn = []

    def spy(s, fig=None):
        fig = draw(s, fig)
        drawn.append((s.gamma, [ax.get_title() for ax in fig.axes]))
        return fig

    monkeypatch.setattr(simulator_module, "draw", spy)

    async def burst():
        app = simulator(delay_s=0.05)
        gamma = sliders(app)["draft length gamma"]
        assert all(not w.continuous_update for w in sliders(app).values() if hasattr(w, "continuous_update"))
        for value in (5, 6, 7):
            gamma.value = value
        assert [g for g, _ in drawn] == [4], "a move must not render while newer values may follow"
        await asyncio.sleep(0.5)
        return app

    app = asyncio.run(burst())
    assert [g for g, _ in drawn] == [4, 7], f"expected the first render and one for gamma 7, got gammas {drawn}"
    titles = drawn[-1][1]
    line, caption = app.children[1].value, app.children[3].value
    expected = ledger.expected_tokens_per_round(0.8, 7)
    speedup = ledger.speedup(0.8, 7, 0.05)
    assert "gamma = 7" in titles[0] and titles[2].startswith(f"{expected:.2f} tokens"), titles
    assert f"E = {expected:.2f}" in line and f"speedup {speedup:.2f}x" in line, line
    assert "gamma = 7" in caption and re.search(r"speedup ([\d.]+)x", caption)[1] == f"{speedup:.2f}", caption

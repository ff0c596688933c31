"""Notebook 01's interactive simulator: speedup curves and a round's timeline.

``simulator()`` returns an ipywidgets app (sliders for a, gamma, c, model size,
bandwidth and batch). One render computes the line under the sliders and the three
panels from the same scenario; in a running kernel a burst of slider changes (a drag,
keys held down) is coalesced into one render after the last change, so the panels never
lag the sliders. ``draw`` alone makes the same figure without widgets (used by tests and
static exports).
"""

from __future__ import annotations

import asyncio
import io
from dataclasses import dataclass, replace

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from specdec import ledger
from specdec.tables import load_gpus


@dataclass(frozen=True)
class Scenario:
    """Everything the cost model needs for one speculative decoding setup."""

    a: float = 0.8  # per-position acceptance probability
    gamma: int = 4  # draft tokens per round
    c: float = 0.05  # draft step time / target step time (at batch 1)
    params_b: float = 6.74  # target size, billions of parameters
    bytes_per_param: float = 2.0  # FP16 / BF16
    bandwidth_gbs: float = 3350.0  # memory bandwidth, GB/s
    tflops: float = 989.0  # dense BF16 TFLOP/s
    batch: int = 1

    @property
    def n_params(self) -> int:
        return max(1, round(self.params_b * 1e9))

    def target_step_s(self, n_tokens: int = 1) -> float:
        return ledger.roofline_step_time_s(
            self.n_params, self.bytes_per_param, n_tokens, self.bandwidth_gbs * 1e9, self.tflops * 1e12
        )

    def speedup(self) -> float:
        return ledger.speedup_at_batch(
            self.a, self.gamma, self.c, self.batch, self.n_params, self.bytes_per_param,
            self.bandwidth_gbs * 1e9, self.tflops * 1e12,
        )


def summary(s: Scenario) -> str:
    """One line of HTML: the numbers a learner reads off the simulator."""
    expected = ledger.expected_tokens_per_round(s.a, s.gamma)
    step_ms = s.target_step_s(s.batch) * 1e3
    plain_tps = s.batch / (step_ms / 1e3)
    fast = s.speedup()
    return (
        f"<b>speedup {fast:.2f}x</b> &nbsp;|&nbsp; E = {expected:.2f} tokens/round &nbsp;|&nbsp; "
        f"target step {step_ms:.2f} ms at batch {s.batch} &nbsp;|&nbsp; "
        f"{plain_tps:,.0f} → {plain_tps * fast:,.0f} tokens/s"
    )


def caption(s: Scenario) -> str:
    """The panels' caption: the scenario they show (what the browser test compares with the line)."""
    return (f"panels for a = {s.a:.2f}, gamma = {s.gamma}, c = {s.c:.3f}, {s.params_b:.2f}B parameters, "
            f"{s.bandwidth_gbs:.0f} GB/s, batch {s.batch}: speedup {s.speedup():.2f}x")


def draw(s: Scenario, fig: Figure | None = None) -> Figure:
    """Three panels: speedup against gamma, speedup against batch, one round's timeline."""
    fig = fig or plt.figure(figsize=(13, 3.8))
    fig.clear()
    ax_gamma, ax_batch, ax_time = fig.subplots(1, 3)

    gammas = list(range(1, 17))
    for a in sorted({0.6, 0.7, 0.8, 0.9, round(s.a, 2)}):
        values = [ledger.speedup(a, g, s.c) for g in gammas]
        ax_gamma.plot(gammas, values, lw=2.5 if a == round(s.a, 2) else 1, label=f"a = {a:.2f}")
    ax_gamma.plot([s.gamma], [ledger.speedup(s.a, s.gamma, s.c)], "ko")
    ax_gamma.axhline(1, color="grey", lw=0.8, ls="--")
    ax_gamma.set(xlabel="draft length gamma", ylabel="speedup (batch 1)",
                 title=f"Speedup vs gamma (dot: gamma = {s.gamma}, c = {s.c:.3f})")
    ax_gamma.legend(fontsize=8)

    batches = [2**k for k in range(0, 11)]
    ax_batch.semilogx(batches, [replace(s, batch=b).speedup() for b in batches], "o-", base=2)
    ax_batch.plot([s.batch], [s.speedup()], "ko")
    ax_batch.axhline(1, color="grey", lw=0.8, ls="--")
    ax_batch.set(xlabel="batch size", ylabel="speedup", title="Speedup vs batch (roofline)")

    plain = s.target_step_s(s.batch) * 1e3
    draft = plain * s.c if s.batch == 1 else ledger.roofline_step_time_s(
        max(1, round(s.c * s.n_params)), s.bytes_per_param, s.batch, s.bandwidth_gbs * 1e9, s.tflops * 1e12) * 1e3
    verify = s.target_step_s(s.batch * (s.gamma + 1)) * 1e3
    expected = ledger.expected_tokens_per_round(s.a, s.gamma)
    for i in range(s.gamma):
        ax_time.barh(1, draft, left=i * draft, color="tab:orange", edgecolor="white")
    ax_time.barh(1, verify, left=s.gamma * draft, color="tab:blue", edgecolor="white")
    round_ms = s.gamma * draft + verify
    whole = int(expected)
    for i in range(whole):
        ax_time.barh(0, plain, left=i * plain, color="tab:grey", edgecolor="white")
    ax_time.barh(0, plain * (expected - whole), left=whole * plain, color="tab:grey", alpha=0.4)
    ax_time.set_yticks([0, 1], [f"plain\n({expected:.2f} steps)", "speculative\nround"])
    ax_time.set_xlabel("time (ms)")
    ax_time.set_title(f"{expected:.2f} tokens: {round_ms:.2f} vs {plain * expected:.2f} ms plain", fontsize=10)
    fig.subplots_adjust(left=0.05, right=0.985, bottom=0.14, top=0.91, wspace=0.42)  # fixed: tight_layout doubles a redraw
    return fig


def simulator(scenario: Scenario | None = None, delay_s: float = 0.1):
    """The interactive app: move a slider, the numbers and the plots follow.

    Sliders report on release (``continuous_update=False``); changes that arrive within ``delay_s`` of
    each other are rendered once, for the newest values (at once when no event loop runs, as in tests).
    """
    import ipywidgets as widgets

    s = scenario or Scenario()
    gpus = load_gpus()
    style = {"description_width": "150px"}
    layout = widgets.Layout(width="430px")
    controls = {
        "a": widgets.FloatSlider(value=s.a, min=0.0, max=1.0, step=0.01, description="acceptance a"),
        "gamma": widgets.IntSlider(value=s.gamma, min=1, max=16, description="draft length gamma"),
        "c": widgets.FloatSlider(value=s.c, min=0.0, max=0.5, step=0.005, readout_format=".3f", description="cost ratio c"),
        "params_b": widgets.FloatLogSlider(value=s.params_b, base=10, min=0, max=2.7, step=0.01,
                                           description="target size (B params)"),
        "bandwidth_gbs": widgets.FloatSlider(value=s.bandwidth_gbs, min=100, max=8000, step=10, description="bandwidth (GB/s)"),
        "batch": widgets.IntSlider(value=s.batch, min=1, max=1024, description="batch size"),
    }
    for widget in controls.values():
        widget.style, widget.layout, widget.continuous_update = style, layout, False
    gpu = widgets.Dropdown(options=["(custom)", *gpus], value="(custom)", description="GPU preset", style=style, layout=layout)
    readout = widgets.HTML()
    panels = widgets.Image(format="png", layout=widgets.Layout(max_width="100%"))
    below = widgets.HTML()  # the panels' caption
    fig = Figure(figsize=(13, 3.8))  # reused by every render; not pyplot's, so nothing else displays it
    state: dict = {"tflops": s.tflops, "timer": None}

    def render() -> None:
        """The line, the panels and their caption, all from the sliders' values now."""
        state["timer"] = None
        current = Scenario(**{name: w.value for name, w in controls.items()}, tflops=state["tflops"],
                           bytes_per_param=s.bytes_per_param)
        png = io.BytesIO()
        draw(current, fig).savefig(png, format="png", dpi=80)
        readout.value = summary(current)
        panels.value = png.getvalue()
        below.value = f"<small>{caption(current)}</small>"

    def request(_change=None) -> None:
        """Render once after the last of a burst of changes: each new change postpones the pending render."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (plain Python): nothing can be pending
            render()
            return
        if state["timer"] is not None:
            state["timer"].cancel()
        state["timer"] = loop.call_later(delay_s, render)

    def pick_gpu(change) -> None:
        if change["new"] in gpus:
            chosen = gpus[change["new"]]
            state["tflops"] = chosen.bf16_flops / 1e12
            controls["bandwidth_gbs"].value = chosen.bandwidth / 1e9
            request()  # the peak FLOP/s changed even if the bandwidth did not

    def custom_bandwidth(change) -> None:
        if gpu.value in gpus and change["new"] != gpus[gpu.value].bandwidth / 1e9:
            gpu.value = "(custom)"  # the preset no longer describes the sliders

    for widget in controls.values():
        widget.observe(request, names="value")
    controls["bandwidth_gbs"].observe(custom_bandwidth, names="value")
    gpu.observe(pick_gpu, names="value")
    render()
    left = widgets.VBox([controls["a"], controls["gamma"], controls["c"]])
    right = widgets.VBox([controls["params_b"], controls["bandwidth_gbs"], controls["batch"], gpu])
    return widgets.VBox([widgets.HBox([left, right]), readout, panels, below])

"""Pictures for notebooks 02-04: one round's positions and caches, distributions as bars."""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from specdec.greedy import round_shapes


def draw_round(history: list[int], draft: list[int], k: int) -> Figure:
    """One greedy round over positions: committed tokens, target input, caches before and after.

    history: the committed tokens (P of them); draft: the gamma proposals; k: how many
    were accepted.
    """
    P, gamma = len(history), len(draft)
    shapes = round_shapes(P, gamma, k)
    n = P + gamma + 1
    fig, ax = plt.subplots(figsize=(1.0 * n + 2.5, 4.2))
    rows = ["proposed", "target input", "committed after", "target KV after", "draft KV after"]

    def cell(row: int, col: int, text: str, color: str) -> None:
        ax.add_patch(Rectangle((col, -row - 1), 0.95, 0.8, color=color, alpha=0.85))
        ax.text(col + 0.47, -row - 0.6, text, ha="center", va="center", fontsize=9)

    for i, t in enumerate(history):
        cell(0, i, str(t), "#9ecae1")
    for i, t in enumerate(draft):
        cell(0, P + i, f"d{i + 1}={t}", "#a1d99b" if i < k else "#fc9272")
    for i in range(shapes.target_input_len):
        cell(1, P - 1 + i, f"row {i}", "#dadaeb")
    for i in range(shapes.committed_len):
        text = str(history[i]) if i < P else (f"d{i - P + 1}" if i < P + k else "target")
        cell(2, i, text, "#9ecae1" if i < P else ("#a1d99b" if i < P + k else "#fdd0a2"))
    for i in range(P + gamma):
        kept = i < shapes.target_cache_len
        cell(3, i, "kept" if kept else "drop", "#c7e9c0" if kept else "#fcbba1")
    for i in range(P + gamma - 1):
        kept = i < shapes.draft_cache_len
        cell(4, i, "kept" if kept else "drop", "#c7e9c0" if kept else "#fcbba1")
    if shapes.draft_catch_up:
        cell(4, P + gamma - 1, "catch up", "#fdd0a2")
    ax.set_yticks([-r - 0.6 for r in range(len(rows))], rows)
    ax.set_xticks([i + 0.47 for i in range(n)], [str(i) for i in range(n)])
    ax.set_xlabel("position")
    ax.set_xlim(-0.1, n)
    ax.set_ylim(-len(rows) - 0.3, 0)
    ax.set_title(f"P = {P}, gamma = {gamma}, k = {k}: commit {shapes.committed_len - P} token(s), "
                 f"target keeps {shapes.target_cache_len} KV entries")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


def bars(named: dict[str, torch.Tensor], title: str = "") -> Figure:
    """Side-by-side bars of several distributions over the same vocabulary."""
    fig, ax = plt.subplots(figsize=(7, 3))
    width = 0.8 / len(named)
    for j, (name, values) in enumerate(named.items()):
        xs = [i + j * width for i in range(len(values))]
        ax.bar(xs, values.tolist(), width=width, label=name)
    V = len(next(iter(named.values())))
    ax.set_xticks([i + 0.4 - width / 2 for i in range(V)], [f"token {i}" for i in range(V)])
    ax.set_ylabel("probability")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    return fig

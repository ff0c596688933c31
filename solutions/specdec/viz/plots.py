"""Pictures for notebooks 02-04: one round's positions and caches, distributions as bars."""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from specdec.greedy import round_shapes
from specdec.tree import tree_mask


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


def draw_tree(parents: tuple[int, ...] | list[int], labels: list[str] | None = None,
              highlight: list[int] | None = None) -> Figure:
    """A candidate tree (root on top, one row per depth) next to its attention mask."""
    n = len(parents)
    depth = [0] * n
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
    rows: dict[int, list[int]] = {}
    for i in range(n):
        rows.setdefault(depth[i], []).append(i)
    x = {i: (k + 1) / (len(nodes) + 1) for nodes in rows.values() for k, i in enumerate(nodes)}
    fig, (ax, mx) = plt.subplots(1, 2, figsize=(10, 3.4), gridspec_kw={"width_ratios": [1.4, 1]})
    for i in range(1, n):
        ax.plot([x[parents[i]], x[i]], [-depth[parents[i]], -depth[i]], color="gray", lw=1, zorder=1)
    for i in range(n):
        on = highlight is not None and i in highlight
        ax.scatter(x[i], -depth[i], s=620, color="tab:green" if on else "white", edgecolor="black", zorder=2)
        ax.text(x[i], -depth[i], labels[i] if labels else str(i), ha="center", va="center", fontsize=8, zorder=3)
    ax.set_axis_off()
    ax.set_title("nodes (root = last committed token)")
    mx.imshow(tree_mask(list(parents)).numpy(), cmap="Greens", vmin=0, vmax=1.3)
    mx.set_xticks(range(n))
    mx.set_yticks(range(n))
    mx.set_xlabel("key node j")
    mx.set_ylabel("query node i")
    mx.set_title("tree mask: i sees j")
    fig.tight_layout()
    return fig


def draw_blocks(B: int, V: int, block: int) -> Figure:
    """A (B, V) tensor as a kernel sees it: one program per row, walking the row in blocks;
    the lanes of the last block past V are masked off."""
    fig, ax = plt.subplots(figsize=(9, 0.55 * B + 1.1))
    colors = plt.get_cmap("tab10")
    n_blocks = -(-V // block)
    for b in range(B):
        for n in range(n_blocks):
            start = n * block
            ax.add_patch(Rectangle((start, B - 1 - b), min(block, V - start), 0.9, facecolor=colors(b % 10),
                                   alpha=0.35 + 0.5 * (n % 2), edgecolor="black", lw=0.6))
            if start + block > V:  # the masked lanes of the partial last block
                ax.add_patch(Rectangle((V, B - 1 - b), start + block - V, 0.9, facecolor="none", edgecolor="gray",
                                       hatch="///", lw=0.6, ls="--"))
        ax.text(-0.01 * V, B - 1 - b + 0.45, f"program {b}", ha="right", va="center", fontsize=8)
    ax.axvline(V, color="black", lw=1)
    ax.text(V, B + 0.05, f" V = {V}", fontsize=8, va="bottom")
    ax.set_xlim(-0.16 * V, n_blocks * block + 1)
    ax.set_ylim(-0.2, B + 0.5)
    ax.set_yticks([])
    ax.set_xlabel(f"column (vocabulary id); blocks of BLOCK_V = {block}, hatched lanes masked (cols >= V)")
    ax.set_title(f"grid = ({B},): program b loops over the {n_blocks} blocks of row b")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


def draw_block_pool(engine, title: str = "", ax=None):
    """The KV block pool of a serving engine (notebook 11): each block coloured by the request that holds it,
    labelled with the request id and the block's index in its table; free blocks grey."""
    if ax is None:
        _, ax = plt.subplots(figsize=(0.55 * engine.num_blocks + 0.5, 1.3))
    owner = {}
    for seq in engine.running + engine.waiting:
        for i, block in enumerate(seq.block_table):
            owner[block] = (seq.seq_id, i)
    colors = plt.get_cmap("tab10")
    for block in range(engine.num_blocks):
        seq_id, index = owner.get(block, (None, None))
        face = "#e8e8e8" if seq_id is None else colors(seq_id % 10)
        ax.add_patch(Rectangle((block, 0), 0.92, 0.92, facecolor=face, edgecolor="black", lw=0.5))
        label = "free" if seq_id is None else f"#{seq_id}.{index}"
        ax.text(block + 0.46, 0.46, label, ha="center", va="center", fontsize=7)
    ax.set_xlim(-0.1, engine.num_blocks)
    ax.set_ylim(-0.1, 1.0)
    ax.axis("off")
    ax.set_title(title or f"block pool: {len(engine.free_blocks)} of {engine.num_blocks} free", fontsize=9)
    return ax

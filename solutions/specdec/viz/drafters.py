"""Pictures for notebook 12: Medusa's Cartesian tree and its attention mask, EAGLE's shift by one,
EAGLE-2's expand-and-rerank. Each is drawn from the package's own code (``flatten_tree``,
``medusa_candidates``, ``eagle_inputs``, ``expand_dynamic_tree``), so it shows what the algorithm does."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import matplotlib.pyplot as plt
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from specdec.drafters.dynamic_tree import TokenPath, expand_dynamic_tree
from specdec.drafters.eagle import eagle_inputs
from specdec.drafters.medusa import medusa_candidates, ranked_tokens
from specdec.tree import flatten_tree, tree_mask

HEAD_COLORS = ("#fdd0a2", "#c6dbef", "#c7e9c0", "#dadaeb", "#fcbba1", "#d9d9d9")


def visible(text: str) -> str:
    """A token's text with its white space shown (both glyphs are in matplotlib's own DejaVu fonts)."""
    return text.replace(" ", "␣").replace("\n", "↵").replace("\t", "\\t") or "''"


def _tidy_x(parents: Sequence[int]) -> list[float]:
    """x of each node: leaves left to right in depth-first order, a parent centred over its children."""
    children: dict[int, list[int]] = {i: [] for i in range(len(parents))}
    for i in range(1, len(parents)):
        children[parents[i]].append(i)
    x = [0.0] * len(parents)
    leaves = 0

    def place(node: int) -> None:
        nonlocal leaves
        if not children[node]:
            x[node], leaves = leaves, leaves + 1
            return
        for child in children[node]:
            place(child)
        x[node] = (x[children[node][0]] + x[children[node][-1]]) / 2

    place(0)
    return x


def _node(ax: Axes, x: float, y: float, text: str, face: str, edge: str = "black", lw: float = 1.0,
          ls: str = "-", fontsize: float = 10) -> None:
    ax.text(x, y, text, ha="center", va="center", fontsize=fontsize, zorder=3,
            bbox={"boxstyle": "round,pad=0.3", "facecolor": face, "edgecolor": edge, "linewidth": lw, "linestyle": ls})


def draw_medusa_tree(root: int, head_logits: torch.Tensor, choices: Sequence[Sequence[int]],
                     label: Callable[[int], str] = str, focus: int | None = None) -> Figure:
    """Medusa's candidate tree (``flatten_tree(choices)``, tokens from ``medusa_candidates``) beside its tree
    attention mask. Node i of the tree is row and column i of the mask; ``focus`` (default: the last node)
    and its ancestors are outlined in both. ``label`` turns a token id into text."""
    tree = flatten_tree(choices)
    tokens = medusa_candidates(root, head_logits, choices)
    names = [visible(label(t)) for t in tokens]
    focus = len(tree) - 1 if focus is None else focus
    path = {focus}
    while min(path) > 0:
        path.add(tree.parents[min(path)])
    depth = max(tree.depths)
    x = _tidy_x(tree.parents)

    fig, (ax, mx) = plt.subplots(1, 2, figsize=(12, 4.4), gridspec_kw={"width_ratios": [1.6, 1]})
    for i in range(1, len(tree)):
        on = i in path
        ax.plot([x[tree.parents[i]], x[i]], [-tree.depths[tree.parents[i]], -tree.depths[i]],
                color="tab:red" if on else "gray", lw=2 if on else 0.8, zorder=1)
    for i in range(len(tree)):
        d = tree.depths[i]
        _node(ax, x[i], -d, names[i], "white" if d == 0 else HEAD_COLORS[(d - 1) % len(HEAD_COLORS)],
              edge="tab:red" if i in path else "black", lw=2 if i in path else 0.8, fontsize=10)
        ax.text(x[i], -d + 0.3, str(i), ha="center", va="bottom", fontsize=7, color="dimgray")
    for d in range(depth + 1):
        if d == 0:
            text = "root: the last committed\ntoken, the target's input"
        else:
            k = 1 + max(r for r, dd in zip(tree.ranks, tree.depths) if dd == d)
            best = " ".join(visible(label(t)) for t in ranked_tokens(head_logits[d - 1])[:k])
            text = f"head {d - 1}, top {k}: {best}\n(position: root's + {d})"
        ax.text(-0.8, -d, text, ha="right", va="center", fontsize=9)
    ax.set_xlim(-4.6, max(x) + 0.5)
    ax.set_ylim(-depth - 0.5, 0.6)
    ax.set_axis_off()
    ax.set_title(f"Medusa's tree: {len(tree)} positions in one verify forward (small numbers: flattened index)",
                 fontsize=10)

    mask = tree_mask(list(tree.parents)).float().numpy()
    mx.imshow(mask, cmap="Greens", vmin=0, vmax=1.4)
    mx.add_patch(Rectangle((-0.45, focus - 0.45), len(tree) - 0.1, 0.9, fill=False, edgecolor="tab:red", lw=1.5))
    ticks = range(len(tree))
    mx.set_yticks(ticks, [f"{i} {names[i]}" for i in ticks], fontsize=8)
    mx.set_xticks(ticks, [str(i) for i in ticks], fontsize=8)
    mx.set_xlabel("key: node j (and the whole committed prefix)")
    mx.set_ylabel("query: node i")
    mx.set_title(f"Tree attention: row {focus} sees its path {sorted(path)}", fontsize=10)
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.12, top=0.91, wspace=0.08)
    return fig


def draw_eagle_shift(n: int = 5) -> Figure:
    """EAGLE's inputs (``eagle_inputs``): at position t the drafter reads the target's feature f_t with the
    embedding of x_{t+1} and predicts f_{t+1}; beside it, the off-by-one (f_t with x_t)."""
    features = torch.arange(1, n + 1, dtype=torch.float32).view(n, 1)  # f_t stored as the number t
    tokens = torch.arange(1, n + 2)  # x_1 .. x_{n+1}
    shifted = [(int(f), int(x)) for f, x in zip(*eagle_inputs(features, tokens))]
    unshifted = [(t, t) for t in range(1, n + 1)]

    fig, axes = plt.subplots(1, 2, figsize=(12, 3.6))
    for ax, pairs, good in ((axes[0], shifted, True), (axes[1], unshifted, False)):
        for t in range(1, n + 2):  # the sequence, and the target's feature above each token it read
            _node(ax, t, 0, f"$x_{{{t}}}$", "#e5e5e5")
            if t <= n:
                _node(ax, t, 1, f"$f_{{{t}}}$", "#c6dbef")
                ax.add_patch(FancyArrowPatch((t, 0.22), (t, 0.78), arrowstyle="-|>", mutation_scale=8, color="gray"))
        color = "tab:green" if good else "tab:red"
        for f, tok in pairs:  # one drafter position per pair: feature from below, token's embedding by an arc
            _node(ax, f, 2.2, "draft", "#fff5eb" if good else "#fee0d2", edge=color)
            ax.add_patch(FancyArrowPatch((f, 1.22), (f, 1.98), arrowstyle="-|>", mutation_scale=8, color=color))
            ax.add_patch(FancyArrowPatch((tok + 0.15, 0.2), (f + 0.2, 1.98), arrowstyle="-|>", mutation_scale=8,
                                         color=color, connectionstyle="arc3,rad=0.35" if good else "arc3,rad=-0.5",
                                         ls="--"))
            if good:
                ax.text(f, 2.75, f"$\\hat f_{{{f + 1}}}$", ha="center", fontsize=11)
        last = pairs[-1][0]
        if good:
            ax.text(last + 0.4, 2.75, f"$\\to$ LM head $\\to x_{{{last + 2}}}$", ha="left", fontsize=10)
            ax.set_title("EAGLE: the drafter at t reads $f_t$ (solid) and the embedding of $x_{t+1}$ (dashed),\n"
                         f"and predicts $\\hat f_{{t+1}}$; the last step, t = {last}, drafts $x_{{{last + 2}}}$", fontsize=10)
        else:
            ax.text((n + 1) / 2, 2.75, "$\\times$", color="tab:red", fontsize=28, ha="center", va="center")
            ax.set_title("Off by one: $f_t$ with $x_t$. $f_t$ has already read $x_t$,\n"
                         "so the drafter learns nothing about which token was sampled next", fontsize=10)
        ax.text(0.4, 0, "tokens", ha="right", va="center", fontsize=9)
        ax.text(0.4, 1, "target\nfeatures", ha="right", va="center", fontsize=9)
        ax.text(0.4, 2.2, "drafter", ha="right", va="center", fontsize=9)
        ax.set_xlim(-0.6, n + 1.9)
        ax.set_ylim(-0.5, 3.2)
        ax.set_axis_off()
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.02, top=0.86, wspace=0.05)
    return fig


#: A made-up drafter for EAGLE-2's picture, completing "for": the next word's probabilities after each path.
TOY_WORDS = (" i", " x", " _", " in", ",", " range", " enumerate", " items", ":")
TOY_DRAFT: dict[TokenPath, tuple[float, ...]] = {
    (): (0.7, 0.2, 0.1, 0, 0, 0, 0, 0, 0),
    (0,): (0, 0, 0, 0.9, 0.08, 0, 0, 0, 0.02),
    (1,): (0, 0, 0, 0.6, 0.25, 0, 0, 0, 0.15),
    (0, 3): (0, 0, 0, 0, 0, 0.8, 0.1, 0.05, 0.05),
    (1, 3): (0, 0, 0, 0, 0, 0.3, 0.1, 0.5, 0.1),
}


def toy_expand(paths: list[TokenPath]) -> torch.Tensor:
    """``expand`` for :data:`TOY_DRAFT`: (len(paths), V) log-probabilities (uniform after an unlisted path)."""
    uniform = (1 / len(TOY_WORDS),) * len(TOY_WORDS)
    return torch.log(torch.tensor([TOY_DRAFT.get(tuple(p), uniform) for p in paths], dtype=torch.float64))


@dataclass(frozen=True)
class DraftNode:
    """A node EAGLE-2 created: its path, the draft's probability of its token, the path product (value)."""

    path: TokenPath
    prob: float
    value: float
    expanded: bool
    kept: bool


def dynamic_tree_nodes(expand: Callable[[list[TokenPath]], torch.Tensor], depth: int, top_k: int,
                       budget: int) -> list[DraftNode]:
    """Every node ``expand_dynamic_tree`` created, in creation order, marked expanded (passed to ``expand``)
    and kept (returned). Children are each expanded node's top_k tokens, as the algorithm creates them."""
    calls: list[tuple[list[TokenPath], torch.Tensor]] = []

    def recording(paths: list[TokenPath]) -> torch.Tensor:
        calls.append((list(paths), out := expand(paths)))
        return out

    kept = set(expand_dynamic_tree(recording, depth, top_k, budget))
    expanded = {p for paths, _ in calls for p in paths}
    logvalue: dict[TokenPath, float] = {(): 0.0}
    nodes = []
    for paths, logprobs in calls:
        for path, row in zip(paths, logprobs):
            for token in torch.sort(row, descending=True, stable=True).indices[:top_k].tolist():
                child = path + (token,)
                logvalue[child] = logvalue[path] + float(row[token])
                nodes.append(DraftNode(child, math.exp(float(row[token])), math.exp(logvalue[child]),
                                       child in expanded, child in kept))
    return nodes


def draw_dynamic_tree(depth: int = 3, top_k: int = 2, budget: int = 6,
                      expand: Callable[[list[TokenPath]], torch.Tensor] = toy_expand,
                      words: Sequence[str] = TOY_WORDS, root: str = "for") -> Figure:
    """EAGLE-2 on a drafter (by default :data:`TOY_DRAFT`): every created node with its draft probability p and
    value v (the product of p along its path); the top_k nodes by value expanded at each step (thick border);
    then all nodes reranked by value and the best ``budget`` kept for verification (green)."""
    nodes = dynamic_tree_nodes(expand, depth, top_k, budget)
    index = {(): 0} | {n.path: i + 1 for i, n in enumerate(nodes)}  # created step by step: parents first
    parents = [-1] + [index[n.path[:-1]] for n in nodes]
    x = _tidy_x(parents)

    fig, (ax, rank) = plt.subplots(1, 2, figsize=(13, 4.4), gridspec_kw={"width_ratios": [2.6, 1]})
    for i, n in enumerate(nodes, start=1):
        ax.plot([x[parents[i]], x[i]], [-(len(n.path) - 1), -len(n.path)], color="gray", lw=0.8, zorder=1)
    _node(ax, x[0], 0, f"{root}\n(root)", "white", lw=2)
    for i, n in enumerate(nodes, start=1):
        word = words[n.path[-1]].strip() or visible(words[n.path[-1]])
        _node(ax, x[i], -len(n.path), f"{word}\np {n.prob:.2f}\nv {n.value:.3f}", "#a1d99b" if n.kept else "#f0f0f0",
              edge="black" if n.kept else "gray",
              lw=2.2 if n.expanded else 0.8, ls="-" if n.kept else "--", fontsize=8)
    for d in range(1, depth + 1):
        ax.text(-0.8, -d, f"step {d}", ha="right", va="center", fontsize=9)
    ax.set_xlim(-1.6, max(x) + 0.6)
    ax.set_ylim(-depth - 0.6, 0.5)
    ax.set_axis_off()
    ax.set_title(f"Expand: each step grows the top_k = {top_k} highest-value nodes of the step before (thick border)",
                 fontsize=10)

    ranked = sorted(nodes, key=lambda n: (-n.value, nodes.index(n)))
    rows = len(ranked) + 1
    for r, n in enumerate(ranked):
        text = f"{r + 1:2d}. {root}" + "".join(words[t] for t in n.path)
        rank.text(0.02, 1 - (r + 1) / rows, f"{text:<22} v {n.value:.3f}", fontsize=9, family="monospace",
                  va="center", color="black" if n.kept else "gray", transform=rank.transAxes)
    cut = 1 - (budget + 0.5) / rows
    rank.axhline(cut, xmin=0.02, xmax=0.98, color="tab:green", lw=1.5)
    rank.set_axis_off()
    rank.set_title(f"Rerank every drafted node by v: verify the best {budget}", fontsize=10)
    fig.suptitle(f"EAGLE-2 (depth {depth}, top_k {top_k}, budget {budget}) on a made-up drafter: p = the draft's "
                 "probability, v = the product of p along the path; green: verified, dashed: dropped", fontsize=10.5)
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.02, top=0.86, wspace=0.02)
    return fig

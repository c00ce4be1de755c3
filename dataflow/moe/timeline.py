"""A Gantt chart of a `SimResult`'s kernels (start and end cycles), one row per kernel."""

from __future__ import annotations


def draw_timeline(result, ax=None, title: str | None = None):
    """Draw `result.kernels` as horizontal bars over cycles; returns the matplotlib Axes.

    Kernels that overlap in time (experts side by side) get rows of their own, so a busy
    expert shows as the longest bar and the kernel after it starts where that bar ends."""
    import matplotlib.pyplot as plt

    ks = list(result.kernels)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.35 * len(ks) + 1.2))
    colours = {"expert": "tab:orange", "index": "tab:purple", "sread": "tab:blue",
               "swrite": "tab:green", "gate": "tab:gray", "dispatch": "tab:cyan",
               "combine": "tab:red"}
    for row, k in enumerate(ks):
        colour = next((c for p, c in colours.items() if k.kernel.startswith(p)), "tab:olive")
        ax.barh(row, k.end_cycle - k.start_cycle, left=k.start_cycle, color=colour,
                edgecolor="black", linewidth=0.5)
        ax.text(k.end_cycle, row, f" {k.end_cycle - k.start_cycle:,}", va="center", fontsize=7)
    ax.set_yticks(range(len(ks)), [k.kernel for k in ks])
    ax.invert_yaxis()
    ax.set_xlabel("cycle")
    ax.axvline(result.cycles, color="black", linestyle="--", linewidth=0.8)
    ax.set_title(title or f"{result.workload} on {result.arch}: {result.cycles:,} cycles")
    return ax

"""What ``bunshin bench epoch`` shows people: the tables and the plot of rollouts still running over time.

Owns: the Markdown tables (per mode and epoch; every other mode's ratios to the reference mode per epoch) and the
plot (one panel per epoch, one line per mode), made from the records alone. The plot turns each record's
``running`` intervals (start, end of every rollout, seconds from the epoch's start) into a step curve of how many
are running. A rollout counts from when it held a rollout slot (its result's
arrival less its ``wall_s`` less its admission wait) to the arrival of its result; group setups are not shown. A
rollout closing its workspace has already given its slot back, so the count may exceed the concurrency briefly.
Must never: compute a figure the JSON does not hold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .report import human_bytes, markdown_table, pyplot


def tables(records: list[dict[str, Any]], rs: list[dict[str, Any]], reference: str = "base") -> str:
    rows = [{**r, "peak": human_bytes(r["peak_bytes"]), "success": f"{r['success_rate']:.0%}",
             "sha": r["rewards_sha256"][:12]} for r in records]
    first = markdown_table(rows, [
        ("mode", "mode"), ("epoch", "epoch"), ("rollouts", "rollouts"), ("success", "success"),
        ("wall_s", "wall s"), ("tool_s_executed", "tool-s executed"), ("tool_s_skipped", "tool-s skipped"),
        ("hit_rate", "hit rate"), ("peak", "peak (cgroup)"), ("total_gib_s", "GiB*s"), ("sha", "behaviour sha256")])
    if not rs:
        return first
    def same(r: dict[str, Any]) -> str:
        if not r["same_actions"]:
            return f"NO: {r['rollouts_acting_differently']} rollouts act or score differently"
        return "yes" if r["same_behaviour"] else f"same actions, {r['rollouts_differing']} saw other observations"

    second = markdown_table([{**r, "same": same(r)} for r in rs], [
        ("mode", "mode"), ("epoch", "epoch"), ("wall_ratio", f"wall /{reference}"),
        ("peak_ratio", f"peak /{reference}"), ("gib_s_ratio", f"GiB*s /{reference}"), ("hit_rate", "hit rate"),
        ("tool_s_skipped", "tool-s skipped"), ("same", f"same behaviour as {reference}")])
    return f"{first}\n\n{second}"


def running_curve(intervals: list[tuple[float, float]]) -> tuple[list[float], list[int]]:
    """(times, rollouts running from each time on): a step function starting at 0 s."""
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    times, counts, n = [0.0], [0], 0
    for t, delta in events:
        n += delta
        if times[-1] == t:
            counts[-1] = n
        else:
            times.append(t)
            counts.append(n)
    return times, counts


def plot(records: list[dict[str, Any]], path: Path, title: str = "") -> None:
    plt = pyplot()
    epochs = sorted({r["epoch"] for r in records})
    fig, axes = plt.subplots(1, len(epochs), figsize=(4.2 * len(epochs) + 1, 4), sharey=True, squeeze=False)
    styles = ("-", "--", ":", "-.")
    modes = list(dict.fromkeys(r["mode"] for r in records))
    for ax, epoch in zip(axes[0], epochs):
        for r in (r for r in records if r["epoch"] == epoch):
            times, counts = running_curve([tuple(x) for x in r["running"]])
            ax.step(times, counts, where="post", linestyle=styles[modes.index(r["mode"]) % len(styles)],
                    label=f"{r['mode']} ({r['wall_s']:.1f} s, hit rate {r['hit_rate']:.2f})")
        ax.set_title(f"epoch {epoch}")
        ax.set_xlabel("seconds since the epoch started")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("rollouts running")
    axes[0][0].yaxis.get_major_locator().set_params(integer=True)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

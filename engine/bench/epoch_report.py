"""What ``bunshin bench epoch`` shows people: the tables and the two plots, rollouts still running over time and
the working set over time.

Owns: the Markdown tables (per mode and epoch, speculation's columns among them; every other mode's ratios to the
reference mode per epoch) and the plots, made from the records alone. Each plot is its own file, one panel per
epoch and one line per mode: ``epoch-{suite}.png`` (``plot``: rollouts running) and ``epoch-{suite}-memory.png``
(``plot_memory``: the working set, each record's ``memory``: the engine meter's samples of the run's cgroup
charge over the epoch, x in seconds since the epoch started, y in GiB). The running plot turns each record's
``running`` intervals (start, end of every rollout, seconds from the epoch's start) into a step curve of how many
are running. A rollout counts from when it held a rollout slot (its result's
arrival less its ``wall_s`` less its admission wait) to the arrival of its result; group setups are not shown. A
rollout closing its workspace has already given its slot back, so the count may exceed the concurrency briefly.
Must never: compute a figure the JSON does not hold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..meter import GiB
from ..report import human_bytes, markdown_table, pyplot


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def spec_cells(r: dict[str, Any]) -> dict[str, str]:
    """Speculation's columns of a record or a ratio row ("-" where the mode does not speculate)."""
    peak = r.get("spec_branch_bytes_peak")
    return {"top1": percent(r.get("spec_top1")), "topk": percent(r.get("spec_topk")),
            "adopted": seconds(r.get("spec_adopted_s")), "wasted": seconds(r.get("spec_wasted_s")),
            "hidden": seconds(r.get("spec_hidden_s")), "branches": "-" if peak is None else human_bytes(peak)}


def tables(records: list[dict[str, Any]], rs: list[dict[str, Any]], reference: str = "base") -> str:
    rows = [{**r, **spec_cells(r), "peak": human_bytes(r["peak_bytes"]), "success": f"{r['success_rate']:.0%}",
             "sha": r["rewards_sha256"][:12], "speculated": r.get("speculated_steps", 0)} for r in records]
    first = markdown_table(rows, [
        ("mode", "mode"), ("epoch", "epoch"), ("rollouts", "rollouts"), ("success", "success"),
        ("wall_s", "wall s"), ("tool_s_executed", "tool-s executed"), ("tool_s_skipped", "tool-s skipped"),
        ("hit_rate", "hit rate"), ("top1", "spec top-1"), ("topk", "spec top-k"), ("speculated", "speculated steps"),
        ("adopted", "adopted tool-s"), ("hidden", "hidden tool-s"), ("wasted", "wasted tool-s"),
        ("branches", "branches peak"), ("peak", "peak (cgroup)"), ("total_gib_s", "GiB*s"),
        ("sha", "behaviour sha256")])
    if not rs:
        return first
    def same(r: dict[str, Any]) -> str:
        if not r["same_actions"]:
            return f"NO: {r['rollouts_acting_differently']} rollouts act or score differently"
        return "yes" if r["same_behaviour"] else f"same actions, {r['rollouts_differing']} saw other observations"

    second = markdown_table([{**r, **spec_cells(r), "same": same(r)} for r in rs], [
        ("mode", "mode"), ("epoch", "epoch"), ("wall_ratio", f"wall /{reference}"),
        ("peak_ratio", f"peak /{reference}"), ("gib_s_ratio", f"GiB*s /{reference}"), ("hit_rate", "hit rate"),
        ("tool_s_skipped", "tool-s skipped"), ("top1", "spec top-1"), ("adopted", "adopted tool-s"),
        ("wasted", "wasted tool-s"), ("same", f"same behaviour as {reference}")])
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


STYLES = ("-", "--", ":", "-.")


def _panels(records: list[dict[str, Any]], ylabel: str, title: str) -> tuple[Any, Any, list[tuple[Any, int]]]:
    """A figure with a panel per epoch (shared y), and (axes, epoch) pairs."""
    plt = pyplot()
    epochs = sorted({r["epoch"] for r in records})
    fig, axes = plt.subplots(1, len(epochs), figsize=(4.2 * len(epochs) + 1, 4), sharey=True, squeeze=False)
    for ax, epoch in zip(axes[0], epochs, strict=True):
        ax.set_title(f"epoch {epoch}")
        ax.set_xlabel("seconds since the epoch started")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    if title:
        fig.suptitle(title)
    return plt, fig, list(zip(axes[0], epochs, strict=True))


def _save(plt: Any, fig: Any, axes: list[tuple[Any, int]], path: Path) -> None:
    for ax, _ in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _style(records: list[dict[str, Any]], r: dict[str, Any]) -> str:
    modes = list(dict.fromkeys(x["mode"] for x in records))
    return STYLES[modes.index(r["mode"]) % len(STYLES)]


def _label(r: dict[str, Any]) -> str:
    spec = f", top-1 {percent(r['spec_top1'])}" if r.get("spec_top1") is not None else ""
    return f"{r['mode']} ({r['wall_s']:.1f} s, hit rate {r['hit_rate']:.2f}{spec})"


def plot(records: list[dict[str, Any]], path: Path, title: str = "") -> None:
    """Rollouts running over time, per epoch and mode."""
    plt, fig, axes = _panels(records, "rollouts running", title)
    for ax, epoch in axes:
        for r in (r for r in records if r["epoch"] == epoch):
            times, counts = running_curve([tuple(x) for x in r["running"]])
            ax.step(times, counts, where="post", linestyle=_style(records, r), label=_label(r))
    axes[0][0].yaxis.get_major_locator().set_params(integer=True)
    _save(plt, fig, axes, path)


def plot_memory(records: list[dict[str, Any]], path: Path, title: str = "") -> None:
    """The working set (the run's cgroup charge) over time, per epoch and mode, from each record's ``memory``."""
    plt, fig, axes = _panels(records, "working set (GiB)", title)
    for ax, epoch in axes:
        for r in (r for r in records if r["epoch"] == epoch):
            points = r.get("memory") or []
            ax.plot([t for t, _ in points], [v / GiB for _, v in points], linestyle=_style(records, r),
                    label=f"{r['mode']} (peak {human_bytes(r['peak_bytes'])}, {r['total_gib_s']:.1f} GiB*s)")
    _save(plt, fig, axes, path)

"""The notebooks' figures: the queue inspection's, drawn from its query results (pandas
DataFrames), and a graph of tasks and their dependencies (the depend notebook's)."""

from __future__ import annotations

import textwrap

from ..readable import count, duration

STATE_COLORS = {"PLAN": "#9e9e9e", "WAIT": "#fdd835", "TAKE": "#64b5f6", "WORK": "#1e88e5", "DONE": "#43a047",
                "FAIL": "#e53935", "GONE": "#fb8c00", "STOP": "#8e24aa"}
FINAL = ("DONE", "FAIL", "GONE", "STOP")


def queue_figure(title: str, since: str, bucket_seconds: float, counts, groups, per_bucket, backlog, timings,
                 start, end, top: int = 10, verdict=None):
    """Six panels under the liveness verdict (``verdict``: status.verdict's, as `pgtask status`
    prints it; green when OK, red otherwise): rows by state (the whole table, log scale), the
    busiest groups' finished tasks, the finish rate (tasks/s) and the due backlog over the window,
    pickup latency and run time of the tasks that ran (log axes). ``per_bucket``: finished tasks by
    bucket (index) and state (columns); ``backlog``: bucket, backlog; ``start``/``end``: the
    window's ends (UTC)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 2, figsize=(12, 11), layout="constrained")
    fig.suptitle(figure_title(title, since, verdict), fontsize=13,
                 color="black" if verdict is None else VERDICT_COLORS[verdict.ok])
    states_panel(axes[0][0], counts)
    groups_panel(axes[0][1], groups[:top], since)
    rate_panel(axes[1][0], per_bucket, bucket_seconds)
    backlog_panel(axes[1][1], backlog, end)
    for ax in axes[1]:
        time_axis(ax, start, end)
    latency_panel(axes[2][0], timings["pickup_seconds"], "pickup latency (start − plan)", "#1e88e5")
    latency_panel(axes[2][1], timings["run_seconds"], "run time (stop − start)", "#43a047")
    return fig


VERDICT_COLORS = {True: "#2e7d32", False: "#c62828"}


def figure_title(title: str, since: str, verdict=None, width: int = 110) -> str:
    """The figure's title: the table and window, then the liveness verdict's headline, wrapped."""
    first = f"{title}: the last {since} (rows by state: the whole table)"
    if verdict is None:
        return first
    return "\n".join([first, *textwrap.wrap(verdict.headline, width)])


def thousands():
    """An axis formatter: whole numbers with thousands separators."""
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _: count(v) if v == int(v) else f"{v:g}")


def states_panel(ax, counts) -> None:
    """Rows in the table by state, all time (``counts``: group, state, tasks)."""
    totals = counts.groupby("state")["tasks"].sum()
    totals = totals.reindex([s for s in STATE_COLORS if s in totals.index])
    if len(totals):
        ax.bar(totals.index, totals.values, color=[STATE_COLORS[s] for s in totals.index])
        ax.set_yscale("log")  # a handful of FAIL rows stays visible beside thousands DONE
        for x, v in zip(totals.index, totals.values):
            ax.annotate(count(v), (x, v), ha="center", va="bottom", xytext=(0, 2), textcoords="offset points")
        ax.set_ylim(0.8, totals.max() * 4)  # headroom for the labels on a log axis
    ax.yaxis.set_major_formatter(thousands())
    ax.set_title("rows in the table by state (all time, log scale)")
    ax.set_ylabel("rows")


def groups_panel(ax, groups, since: str) -> None:
    """The busiest groups' tasks finished in the window, by final state (``groups``: status.groups')."""
    from matplotlib.ticker import MaxNLocator

    busiest = [g for g in groups if g["finished_window"]][::-1]
    if busiest:
        left = [0] * len(busiest)
        names = [g["group"] if len(g["group"]) <= 24 else g["group"][:23] + "…" for g in busiest]
        for state in FINAL:
            widths = [g[f"{state.lower()}_window"] for g in busiest]
            ax.barh(names, widths, left=left, color=STATE_COLORS[state], label=state)
            left = [a + b for a, b in zip(left, widths)]
        ax.set_xlim(0, max(left) * 1.15)
        ax.legend(loc="lower right", fontsize="small")
    ax.xaxis.set_major_formatter(thousands())
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(f"busiest groups: finished in the last {since}")
    ax.set_xlabel("tasks")


def rate_panel(ax, per_bucket, bucket_seconds: float) -> None:
    """Finished tasks a second per bucket, stacked by final state."""
    if len(per_bucket):
        bottom = None
        for state in [s for s in FINAL if s in per_bucket.columns]:
            values = per_bucket[state] / bucket_seconds
            ax.bar(per_bucket.index, values, width=bucket_seconds / 86400 * 0.8, align="edge", bottom=bottom,
                   color=STATE_COLORS[state], label=state)
            bottom = values if bottom is None else bottom + values
        ax.set_ylim(0, float(bottom.max()) * 1.15)
        ax.legend(loc="upper left", fontsize="small")
    ax.set_title(f"finished tasks a second (per {duration(bucket_seconds)})")
    ax.set_ylabel("tasks/s")


def backlog_panel(ax, backlog, end) -> None:
    """The due backlog over the window, as steps held until ``end``."""
    from matplotlib.ticker import MaxNLocator

    if len(backlog):
        xs = list(backlog["bucket"]) + [end]
        ys = list(backlog["backlog"]) + [backlog["backlog"].iloc[-1]]
        ax.step(xs, ys, where="post", color="#546e7a")
        ax.fill_between(xs, ys, step="post", color="#546e7a", alpha=0.2)
        ax.set_ylim(0, max(ys) * 1.15 if max(ys) > 0 else 1)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_formatter(thousands())
    ax.set_title("due backlog (planned, not yet started)")
    ax.set_ylabel("tasks")


def time_axis(ax, start, end) -> None:
    """The window from ``start`` to ``end`` on the x axis, in UTC."""
    import matplotlib.dates as mdates

    locator = mdates.AutoDateLocator(minticks=4, maxticks=8)
    ax.set_xlim(start, end)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    ax.set_xlabel("time (UTC)")


def latency_panel(ax, seconds, what: str, color: str) -> None:
    """A histogram of ``seconds`` (one value per task that ran) on a log axis, p50 and p99 marked."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter

    values = seconds.dropna().clip(lower=1e-4)
    if len(values):
        low, high = values.min(), max(values.max(), values.min() * 10)
        bins = [low * (high / low) ** (i / 30) for i in range(31)]
        ax.hist(values, bins=bins, color=color)
        ax.set_xscale("log")
        for q, style in ((0.5, "--"), (0.99, ":")):
            v = values.quantile(q)
            ax.axvline(v, color="black", linestyle=style, label=f"p{round(q * 100)} {duration(v)}")
        ax.legend(loc="upper right", fontsize="small")
        ax.set_ylim(0, ax.get_ylim()[1] * 1.15)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: duration(v)))
        ax.xaxis.set_minor_formatter(NullFormatter())  # a log axis labels its minor ticks too
    ax.set_title(f"{what}: {count(len(values))} tasks that ran (log scale)")
    ax.set_xlabel("")
    ax.set_ylabel("tasks")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def dag_figure(title: str, tasks: list[dict]):
    """Tasks as a graph, each node coloured by its state and each arrow from a task to one that
    runs after it. ``tasks``: dicts with ``id``, ``label``, ``state`` and ``after`` (ids; those not
    among the tasks are left out). Columns are the longest chain of dependencies before a task."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    by_id = {t["id"]: t for t in tasks}
    depth: dict[int, int] = {}

    def level(i: int) -> int:  # the ids form no cycle: a task names only tasks older than itself
        if i not in depth:
            depth[i] = 1 + max((level(a) for a in by_id[i]["after"] or () if a in by_id), default=-1)
        return depth[i]

    columns: dict[int, list[int]] = {}
    for t in sorted(tasks, key=lambda t: t["id"]):
        columns.setdefault(level(t["id"]), []).append(t["id"])
    tallest = max((len(c) for c in columns.values()), default=1)
    at = {i: (x, (len(ids) - 1) / 2 - y) for x, ids in columns.items() for y, i in enumerate(ids)}  # centred
    fig, ax = plt.subplots(figsize=(2.6 * max(len(columns), 2), 1.1 * tallest + 1.2), layout="constrained")
    for t in tasks:
        for a in t["after"] or ():
            if a in at:
                ax.annotate("", at[t["id"]], at[a], arrowprops={"arrowstyle": "-|>", "color": "#616161",
                                                                "shrinkA": 38, "shrinkB": 38})
    for t in tasks:
        x, y = at[t["id"]]
        ax.text(x, y, f"{t['label']}\n{t['state']}", ha="center", va="center", fontsize=9,
                bbox={"boxstyle": "round,pad=0.5", "facecolor": STATE_COLORS.get(t["state"], "#ffffff"),
                      "edgecolor": "#424242"})
    ax.set_xlim(-0.6, max(len(columns), 1) - 0.4)
    ax.set_ylim(-tallest / 2 - 0.2, tallest / 2 + 0.2)
    ax.axis("off")
    shown = [s for s in STATE_COLORS if any(t["state"] == s for t in tasks)]
    ax.legend(handles=[Patch(facecolor=STATE_COLORS[s], edgecolor="#424242", label=s) for s in shown],
              loc="upper center", bbox_to_anchor=(0.5, 0), ncol=len(shown) or 1, frameon=False)
    ax.set_title(title)
    return fig

"""The operators' console (notebooks/console.ipynb): ipywidgets over one task table, refreshed in
the background on the kernel's event loop -- the reads run in a worker thread, the widgets are
updated on the loop -- so it stays live without re-running a cell, in JupyterLab and in Voila.
Filters select tasks; an action calls a verb over them, shows its preview and acts only once
confirmed. What it reads and calls is pgtask/console_data.py; how it looks, pgtask/console_view.py."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from html import escape

import ipywidgets as w

from . import console_data as data
from . import console_view as view
from .patterns import notebook

# A dropdown's "(any)": its value is a NUL character, which no PostgreSQL text holds, so no group's
# name (anyone's text) is mistaken for it.
ANY = "\x00"
ANY_OPTION = ("(any)", ANY)
AGES = (ANY_OPTION, *((age, age) for age in ("5 minutes", "1 hour", "1 day", "7 days")))
SINCE = "1 hour"


@dataclass(frozen=True)
class Pending:
    """An action previewed and awaiting its confirmation: the verb and exactly what it selects."""
    verb: str
    filters: data.Filters


def text_filter(description: str, css: str) -> w.Text:
    box = w.Text(description=description, continuous_update=False, layout=w.Layout(width="260px"))
    box.add_class(css)
    return box


def button(label: str, css: str, style: str = "") -> w.Button:
    b = w.Button(description=label, button_style=style)
    b.add_class(css)
    return b


class Filters:
    """The filter widgets, and the data.Filters they say."""

    def __init__(self):
        self.state = w.Dropdown(description="state", options=[ANY_OPTION, *((s, s) for s in data.STATES)],
                                value=ANY)
        self.group = w.Dropdown(description="group", options=[ANY_OPTION], value=ANY)
        self.author = text_filter("author", "pgtask-author")
        self.error = text_filter("error has", "pgtask-error")
        self.older = w.Dropdown(description="older than", options=AGES, value=ANY)
        self.ids = text_filter("task ids", "pgtask-ids")
        self.state.add_class("pgtask-state")
        self.group.add_class("pgtask-group")
        self.older.add_class("pgtask-older")
        self.widgets = [self.state, self.group, self.author, self.error, self.older, self.ids]
        self.box = w.VBox([w.HBox(self.widgets[:3]), w.HBox(self.widgets[3:])])

    def value(self) -> data.Filters:
        """What the widgets select (a choice as it is, a text as typed; "(any)" and an empty text
        select every row); a bad task id list raises ValueError."""
        def given(v):
            return None if v in (ANY, "", None) else v

        return data.Filters(state=given(self.state.value), group=given(self.group.value),
                            author=given(self.author.value), error_has=given(self.error.value),
                            older=given(self.older.value), ids=data.parse_ids(self.ids.value))

    def offer_groups(self, groups: list[str]) -> None:
        """The group choices: the table's groups (and the one chosen, even when it has none now)."""
        chosen = self.group.value
        options = [ANY_OPTION, *((g, g) for g in sorted(set(groups) | ({chosen} - {ANY})))]
        if list(self.group.options) != options:
            self.group.set_trait("options", options)
            self.group.set_trait("value", chosen)

    def observe(self, handler) -> None:
        for widget in self.widgets:
            widget.observe(handler, names="value")


class Console:
    """The console of one task table; ``widget`` is what the notebook displays."""

    def __init__(self, target: data.Target, every: float, where: str = ""):
        self.target, self.every = target, every
        self.filters = Filters()
        self.verdict, self.groups, self.tasks = w.HTML(), w.HTML(), w.HTML()
        self.verdict.add_class("pgtask-verdict-box")
        self.tasks.add_class("pgtask-tasks")
        self.clock = w.HTML()
        self.clock.add_class("pgtask-clock")
        self.message = w.HTML()
        self.message.add_class("pgtask-message")
        self.prompt = w.HTML()
        self.prompt.add_class("pgtask-prompt")
        self.confirm = button("Confirm", "pgtask-confirm", "danger")
        self.dismiss = button("Cancel", "pgtask-dismiss")
        self.confirm_box = w.HBox([self.prompt, self.confirm, self.dismiss], layout=w.Layout(display="none"))
        self.confirm_box.add_class("pgtask-confirm-box")
        self.actions = [button(label, f"pgtask-{verb}", style) for verb, label, style in (
            ("retry", "Retry", "warning"), ("cancel", "Cancel tasks", "warning"),
            ("delete", "Delete", "danger"),
            ("pause", "Pause group", ""), ("resume", "Resume group", ""))]
        for b, verb in zip(self.actions, (*data.TASK_VERBS, *data.GROUP_VERBS)):
            b.on_click(lambda _b, verb=verb: self.spawn(self.ask(verb)))
        self.confirm.on_click(lambda _b: self.spawn(self.act()))
        self.dismiss.on_click(lambda _b: self.call_off())
        self.pending: Pending | None = None
        self.wake = asyncio.Event()
        self.filters.observe(lambda _change: self.wake.set())
        title = w.HTML(f"<h3>pgtask console: {escape(target.schema)}.{escape(target.table)}</h3>"
                       f"<small>server: {escape(where)}</small>")
        self.widget = w.VBox([title, self.clock, self.verdict, self.groups, w.HTML("<b>tasks</b>"),
                              self.filters.box,
                              w.HBox(self.actions), self.confirm_box, self.message, self.tasks])
        self.widget.add_class("pgtask-console")
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_task: asyncio.Task | None = None

    # -- the live view ---------------------------------------------------------------------------

    def start(self) -> Console:
        """Refresh now and every ``every`` seconds (and at once when a filter changes), in the
        background of the kernel's running event loop."""
        self.loop = asyncio.get_running_loop()
        self.loop_task = self.loop.create_task(self.run())
        return self

    def spawn(self, coro) -> None:
        """A button's work on the kernel's loop (from whichever thread the click arrives on)."""
        asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        if self.loop_task is not None:
            self.loop_task.cancel()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self.wake.clear()
            try:
                filters = self.filters.value()
                snap = await loop.run_in_executor(None, data.snapshot, self.target, filters, SINCE)
                self.show(snap)
                self.clock.set_trait("value", f"<small>refreshed {time.strftime('%H:%M:%S')}, "
                                              f"every {self.every:g} s</small>")
            except Exception as exc:  # shown in the page; the next refresh tries again
                self.clock.set_trait("value", f"<small>refresh failed at {time.strftime('%H:%M:%S')}: "
                                              f"{view.error(exc)}</small>")
            try:
                await asyncio.wait_for(self.wake.wait(), self.every)
            except asyncio.TimeoutError:
                pass

    def show(self, snap: data.Snapshot) -> None:
        self.verdict.set_trait("value", view.verdict(snap))
        self.groups.set_trait("value", view.groups(snap, SINCE))
        self.tasks.set_trait("value", view.tasks(snap))
        self.filters.offer_groups([g["group"] for g in snap.groups])

    # -- the actions -----------------------------------------------------------------------------

    def call(self, verb: str, filters: data.Filters, preview: bool) -> data.Outcome:
        if verb in data.GROUP_VERBS:
            return data.group_verb(self.target, verb, filters.group, preview)
        return data.task_verb(self.target, verb, filters, preview)

    def busy(self, working: bool) -> None:
        for b in (*self.actions, self.confirm):
            b.set_trait("disabled", working)

    async def off_loop(self, verb: str, filters: data.Filters, preview: bool) -> data.Outcome:
        """A verb's call in a worker thread: the page keeps refreshing meanwhile."""
        self.busy(True)
        try:
            return await self.loop.run_in_executor(None, self.call, verb, filters, preview)
        finally:
            self.busy(False)

    async def ask(self, verb: str) -> None:
        """An action's first step: its preview, and the confirmation."""
        self.call_off(quiet=True)
        try:
            filters = self.filters.value()
            outcome = await self.off_loop(verb, filters, preview=True)
        except Exception as exc:
            self.message.set_trait("value", view.error(exc))
            return
        self.pending = Pending(verb, filters)
        self.message.set_trait("value", "")
        self.prompt.set_trait("value", view.preview(outcome))
        self.confirm_box.layout.set_trait("display", "flex")

    async def act(self) -> None:
        """Confirmed: the verb over exactly what was previewed; its result, then a refresh."""
        pending, self.pending = self.pending, None
        self.confirm_box.layout.set_trait("display", "none")
        if pending is None:
            return
        self.message.set_trait("value", f"<span class='pgtask-working'>{pending.verb}: working…</span>")
        try:
            outcome = await self.off_loop(pending.verb, pending.filters, preview=False)
            self.message.set_trait("value", view.result(outcome))
        except Exception as exc:
            self.message.set_trait("value", view.error(exc))
        self.wake.set()

    def call_off(self, quiet: bool = False) -> None:
        """The confirmation dismissed: nothing is done."""
        if self.pending is not None and not quiet:
            self.message.set_trait("value", f"<span class='pgtask-result'>{self.pending.verb}: not done, "
                                            "nothing changed.</span>")
        self.pending = None
        self.confirm_box.layout.set_trait("display", "none")


def open_console(dsn: str = "", schema: str = "public", table: str = "task", refresh: float = 5) -> Console:
    """The notebook's console: its parameters (or the environment's, see console_data.settings),
    refreshing in the background."""
    target, every = data.settings(dsn, schema, table, refresh)
    conninfo, where = notebook.server(target.dsn)
    return Console(replace(target, dsn=conninfo), every, where).start()

"""The Hosts tab: who is connected, what they changed, and one-click host setup.

Connected clients (name and version from the MCP handshake, transport, since when, requests,
last activity) are polled from the runtime's client registry once a second while the tab is
shown. The activity feed lists writes, updates and deletes as they happen, newest first, with
the client that made them (convmem_engine.runtime.activity); clicking an entry opens the
message. No content is shown or kept here: ids, kinds, times and names only.

The feed follows the activity log only while the tab is shown (the tab current in a window
that is shown and not minimized): hosts writing while nobody looks cost the app no GUI work.
When it is shown again it catches up from the log, which keeps as many entries as the feed
shows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QGroupBox,
    QHeaderView,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from convmem_app.browser.host_setup import HostSetup
from convmem_app.inbox import Inbox
from convmem_engine.runtime.activity import MAX_ENTRIES, Activity, ActivityLog
from convmem_engine.runtime.clients import ClientInfo

FEED_MAX: Final = MAX_ENTRIES  # the log keeps what the feed shows: a hidden feed catches up
_KIND_TEXT: Final = {
    "write": "wrote",
    "update": "updated",
    "delete": "deleted",
    "rebuild": "rebuilt",
}


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def _ago(t: float, now: float) -> str:
    s = max(0, int(now - t))
    if s < 60:
        return f"{s} s ago"
    if s < 3600:
        return f"{s // 60} min ago"
    return f"{s // 3600} h ago"


def client_label(c: ClientInfo) -> str:
    return f"{c.name} {c.version}".strip() or f"unnamed {c.transport} client"


class HostsPage(QWidget):
    openRequested = Signal(str, str)  # message id, session id
    clientsChanged = Signal(list)  # the ClientInfo list shown

    def __init__(
        self,
        host_setup: HostSetup,
        clients: Callable[[], list[ClientInfo]] | None = None,
        activity: ActivityLog | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.host_setup = host_setup
        self._clients = clients
        self._feed_log = activity
        self.table = QTableWidget(0, 6)
        self.table.setObjectName("clientsTable")
        self.table.setHorizontalHeaderLabels(
            ["Client", "Transport", "Connected", "Requests", "Last activity", "Id"]
        )
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().hide()
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.empty_clients = QLabel("No host is connected right now.")
        self.feed = QListWidget()
        self.feed.setObjectName("activityFeed")
        self.feed.itemActivated.connect(self._open)  # Enter
        self.feed.itemClicked.connect(self._open)  # one click from the message
        clients_box = QGroupBox("Connected now")
        cb = QVBoxLayout(clients_box)
        cb.addWidget(self.empty_clients)
        cb.addWidget(self.table)
        feed_box = QGroupBox("Activity (newest first; click an entry to open its message)")
        fb = QVBoxLayout(feed_box)
        fb.addWidget(self.feed)
        setup_box = QGroupBox("Connect a host")
        sb = QVBoxLayout(setup_box)
        sb.addWidget(host_setup)
        layout = QVBoxLayout(self)
        layout.addWidget(clients_box, 1)
        layout.addWidget(feed_box, 2)
        layout.addWidget(setup_box)
        self.timer = QTimer(self)
        self.timer.setInterval(1000)
        self.timer.timeout.connect(self.refresh_clients)
        # changes come in bursts (an import writes thousands): writer threads hand entries
        # over in batches, shown together (one GUI wake-up per interval while they keep coming).
        # Each item carries the generation of the subscription that put it: batches still on
        # their way when the feed stopped following are dropped (the catch-up has them).
        self._inbox: Inbox[tuple[int, Activity]] = Inbox(self._show_entries, self)
        self._unfollow: Callable[[], None] | None = None
        self._generation = 0
        self._newest: Activity | None = None  # the newest entry in the feed
        self._stopped = False
        self.refresh_clients()

    @property
    def following(self) -> bool:
        """The feed is live (the tab is shown)."""
        return self._unfollow is not None

    def stop(self) -> None:
        self._stopped = True
        self.timer.stop()
        self._stop_following()

    def showEvent(self, event: Any) -> None:
        super().showEvent(event)
        self.refresh_clients()
        self.host_setup.refresh()
        self.timer.start()
        self._follow()

    def hideEvent(self, event: Any) -> None:
        super().hideEvent(event)
        self.timer.stop()
        self._stop_following()

    def _follow(self) -> None:
        """Catch up with the log, then follow it live."""
        if self._unfollow is not None or self._feed_log is None or self._stopped:
            return
        self._generation += 1
        generation, put = self._generation, self._inbox.put
        entries, self._unfollow = self._feed_log.follow(lambda entry: put((generation, entry)))
        newest = self._newest
        start = 0
        if newest is not None:
            for i in range(len(entries) - 1, -1, -1):
                if entries[i] == newest:
                    start = i + 1
                    break
            else:  # what the feed shows has left the log: show the log afresh
                self.feed.clear()
        self._add_entries(entries[start:])

    def _stop_following(self) -> None:
        if self._unfollow is not None:
            self._unfollow()
            self._unfollow = None
            self._generation += 1

    def refresh_clients(self) -> None:
        clients = self._clients() if self._clients is not None else []
        now = time.time()
        self.table.setRowCount(len(clients))
        for row, c in enumerate(clients):
            cells = (
                client_label(c),
                c.transport,
                _clock(c.since),
                f"{c.requests:,}",
                _ago(c.last_activity, now),
                str(c.client_id),
            )
            for col, text in enumerate(cells):
                self.table.setItem(row, col, QTableWidgetItem(text))
        self.table.setVisible(bool(clients))
        self.empty_clients.setVisible(not clients)
        self.clientsChanged.emit(clients)

    def _show_entries(self, items: list[tuple[int, Activity]]) -> None:  # GUI thread, inbox
        generation = self._generation
        self._add_entries([entry for g, entry in items if g == generation])

    def _add_entries(self, entries: list[Activity]) -> None:
        if not entries:
            return
        self.feed.setUpdatesEnabled(False)
        for entry in entries[-FEED_MAX:]:
            self._add_entry(entry)
        self.feed.setUpdatesEnabled(True)
        self._newest = entries[-1]

    def _add_entry(self, entry: Activity) -> None:
        who = entry.client or "this app"
        what = _KIND_TEXT.get(entry.kind, entry.kind)
        where = f" in {entry.session_id}" if entry.session_id else ""
        text = f"{_clock(entry.at)}  {who} {what} {entry.message_id or 'the index'}{where}"
        item = QListWidgetItem(text)
        item.setData(Qt.ItemDataRole.UserRole, (entry.message_id, entry.session_id))
        self.feed.insertItem(0, item)
        while self.feed.count() > FEED_MAX:
            self.feed.takeItem(self.feed.count() - 1)

    def _open(self, item: QListWidgetItem) -> None:
        data = item.data(Qt.ItemDataRole.UserRole)
        if isinstance(data, tuple) and data[0] and data[1]:
            self.openRequested.emit(data[0], data[1])


def client_names(clients: list[ClientInfo]) -> list[str]:
    """For the tray's status line and tooltip: who is connected (each name once)."""
    return sorted({client_label(c) for c in clients})

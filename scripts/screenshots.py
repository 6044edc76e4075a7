#!/usr/bin/env python3
"""Screenshots of the memory browser for the README: every view, light and dark.

Starts a private Xvfb display (installing Xvfb and Qt's xcb libraries with apt-get when missing;
CI does not run this), fills a demo store in a temp dir, opens the browser on it and saves PNGs
to docs/screenshots/.

    .venv/bin/python scripts/screenshots.py [--out docs/screenshots]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
APT_PACKAGES = [
    "xvfb",
    "xauth",
    "libxcb-cursor0",
    "libxcb-icccm4",
    "libxcb-image0",
    "libxcb-keysyms1",
    "libxcb-render-util0",
    "libxcb-shape0",
    "libxkbcommon-x11-0",
]


def ensure_xvfb() -> None:
    if shutil.which("Xvfb"):
        return
    apt = shutil.which("apt-get")
    if apt is None:
        sys.exit("Xvfb is missing and apt-get is not available: install Xvfb first")
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run([*sudo, apt, "-qq", "update"], check=True, env=env)
    subprocess.run(
        [*sudo, apt, "-qq", "install", "-y", "--no-install-recommends", *APT_PACKAGES],
        check=True,
        env=env,
    )


def start_xvfb() -> tuple[subprocess.Popen[bytes], str]:
    for n in range(90, 140):
        if not Path(f"/tmp/.X11-unix/X{n}").exists() and not Path(f"/tmp/.X{n}-lock").exists():
            display = f":{n}"
            proc = subprocess.Popen(
                ["Xvfb", display, "-screen", "0", "1600x1000x24", "-nolisten", "tcp"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for _ in range(100):
                if Path(f"/tmp/.X11-unix/X{n}").exists():
                    return proc, display
                time.sleep(0.05)
            proc.kill()
    sys.exit("could not start Xvfb")


# --- the demo store -------------------------------------------------------------------------

DEMO: list[tuple[str, str, str, dict[str, Any]]] = [
    ("project-atlas", "user", "We need to decide on the storage engine for Atlas this week.", {}),
    (
        "project-atlas",
        "assistant",
        "Options: SQLite with WAL, an append-only log with snapshots, or PostgreSQL. For a "
        "single-user desktop app the append-only log is simplest to make crash-safe.",
        {"memory_kind": "episode", "importance": 60, "tags": ["atlas", "storage"]},
    ),
    (
        "project-atlas",
        "user",
        "Decision: append-only log, fsync before acknowledging, compaction on demand.",
        {
            "memory_kind": "semantic",
            "memory_tier": "long",
            "importance": 90,
            "tags": ["atlas", "decision", "storage"],
            "summary": "Atlas stores data in an append-only log with on-demand compaction.",
        },
    ),
    (
        "project-atlas",
        "assistant",
        "To compact: write live records to a temp file, fsync, os.replace, fsync the directory.",
        {"memory_kind": "procedure", "memory_tier": "mid", "importance": 75, "tags": ["atlas"]},
    ),
    ("cooking", "user", "What was the trick for crispy roast potatoes again?", {}),
    (
        "cooking",
        "assistant",
        "Parboil for 8 minutes, shake them in the pot to rough the edges, then roast in very "
        "hot fat at 220 °C for 45 minutes, turning once.",
        {"memory_kind": "procedure", "importance": 55, "tags": ["recipe", "potatoes"]},
    ),
    (
        "cooking",
        "user",
        "I prefer them without rosemary.",
        {"memory_kind": "preference", "memory_tier": "long", "importance": 70, "tags": ["taste"]},
    ),
    ("travel-2026", "user", "Book the train to Kyoto for the 14th, window seat if possible.", {}),
    (
        "travel-2026",
        "assistant",
        "Booked: Nozomi 217, car 7, seat 12E (window). Departs Tokyo 09:33, arrives 11:47.",
        {"memory_kind": "episode", "importance": 65, "tags": ["travel", "booking"]},
    ),
    (
        "travel-2026",
        "user",
        "Always prefer window seats on trains.",
        {"memory_kind": "preference", "memory_tier": "long", "importance": 80, "tags": ["travel"]},
    ),
    ("scratch", "user", "temporary note: call the plumber", {"memory_tier": "discard"}),
    ("scratch", "user", "temporary note: buy stamps", {"memory_tier": "discard"}),
]


class _ToolCalls:
    """The demo's writes as a host sends them (metadata as JSON strings): each tool name runs
    `ToolRegistry.call`; an argument given as None is left out."""

    def __init__(self, service: Any) -> None:
        from convmem_engine.tools import ToolRegistry

        self._tools = ToolRegistry.for_service(service)

    def __getattr__(self, name: str) -> Any:
        def call(**arguments: Any) -> Any:
            given = {key: value for key, value in arguments.items() if value is not None}
            return self._tools.call(name, given)

        return call


def fill_demo(service: Any) -> dict[str, str]:
    svc = _ToolCalls(service)
    ids: dict[str, str] = {}
    for i, (session, role, content, meta) in enumerate(DEMO):
        msg = svc.write_message(
            session_id=session,
            role=role,
            content=content,
            metadata_json=json.dumps(meta) if meta else None,
        )["message"]
        ids[f"{session}:{i}"] = msg["message_id"]
    decision = ids["project-atlas:2"]
    options = ids["project-atlas:1"]
    procedure = ids["project-atlas:3"]
    svc.update_message(
        message_id=decision,
        metadata_json=json.dumps(
            {
                "relations": [{"type": "derived_from", "message_id": options}],
                "source_message_ids": [options],
            }
        ),
    )
    svc.update_message(
        message_id=procedure,
        metadata_json=json.dumps({"relations": [{"type": "depends_on", "message_id": decision}]}),
    )
    summary = svc.write_message(
        session_id="project-atlas",
        role="assistant",
        content="Summary of the storage discussion: " + ("log, snapshot, compaction. " * 300),
        metadata_json=json.dumps(
            {
                "memory_kind": "summary",
                "memory_tier": "long",
                "importance": 85,
                "tags": ["atlas", "summary"],
                "summary": "Storage: append-only log, snapshot, on-demand compaction.",
                "relations": [
                    {"type": "derived_from", "message_id": decision},
                    {"type": "related_to", "message_id": ids["scratch:10"]},
                ],
            }
        ),
    )["message"]
    ids["summary"] = summary["message_id"]
    svc.delete_message(message_id=ids["scratch:10"])  # shows as a deleted relation target
    for n in range(40):  # a longer session so the history pages
        svc.write_message(
            session_id=f"daily-log-{n % 6:02}",
            role="user" if n % 2 else "assistant",
            content=f"Daily log entry {n}: standup notes, blockers and follow-ups.",
            metadata_json=json.dumps({"tags": ["daily"], "importance": 30 + n % 40}),
        )
    return ids


# --- inside the display -----------------------------------------------------------------------


def inner(out: Path, only: set[str]) -> None:
    sys.path.insert(0, str(ROOT))
    from PySide6.QtCore import QEventLoop, QSettings, Qt, QTimer
    from PySide6.QtWidgets import QApplication, QWidget

    from convmem_app.browser import MemoryBrowser
    from convmem_app.browser.browse_panel import DETAIL_CONTEXT, DETAIL_EDIT, DETAIL_MESSAGE
    from convmem_app.browser.maintenance_panel import MaintenancePanel
    from convmem_app.browser.search_panel import SearchPanel
    from convmem_engine.service import MemoryService

    app = QApplication(sys.argv)
    app.setStyle("Fusion")

    def pump(ms: int = 150) -> None:
        loop = QEventLoop()
        QTimer.singleShot(ms, loop.quit)
        loop.exec()

    def wait(pred: Callable[[], bool], timeout: float = 10.0) -> None:
        end = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > end:
                raise TimeoutError("screenshot scene did not settle")
            pump(30)
        pump(200)

    def shot(widget: QWidget, name: str) -> None:
        if only and name not in only:
            return
        path = out / name
        widget.grab().save(str(path))
        print(f"saved {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")

    with tempfile.TemporaryDirectory() as tmp:
        svc = MemoryService.open(Path(tmp) / "data")
        ids = fill_demo(svc)
        settings = QSettings(str(Path(tmp) / "settings.ini"), QSettings.Format.IniFormat)
        b = MemoryBrowser(svc, settings=settings)
        b.resize(1440, 900)
        b.show()
        wait(lambda: b.browse.sessions_model.exhausted and b.browse.sessions_model.rowCount() > 0)
        b.browse.select_session("project-atlas")
        wait(lambda: b.browse.history_model.rowCount() > 0 and not b.browse.history_model.loading)
        b.open_message(ids["summary"], "project-atlas")
        wait(lambda: b.browse.current_message() is not None and not b.browse.detail.loading)
        b.browse.detail_tabs.setCurrentIndex(DETAIL_MESSAGE)
        shot(b, "browse.png")

        b.open_message(ids["project-atlas:2"], "project-atlas")
        wait(lambda: (b.browse.current_message() or {}).get("message_id") == ids["project-atlas:2"])
        b.browse.detail_tabs.setCurrentIndex(DETAIL_EDIT)
        b.browse.editor.tags.setText(
            "atlas, decision, storage, " + "x" * 130
        )  # shows inline validation
        pump()
        shot(b, "edit-metadata.png")
        b.browse.editor.revert()

        b.open_message(ids["summary"], "project-atlas")
        wait(lambda: (b.browse.current_message() or {}).get("message_id") == ids["summary"])
        b.browse.detail_tabs.setCurrentIndex(DETAIL_CONTEXT)
        b.browse.context_panel.depth_spin.setValue(2)
        wait(lambda: b.browse.context_panel.result is not None)
        shot(b, "context-relations.png")

        b.focus_page("search")
        b.page_of(SearchPanel).query.setText("storage")
        b.page_of(SearchPanel).search()
        wait(lambda: b.page_of(SearchPanel).model.rowCount() > 0)
        shot(b, "search.png")

        b.show_page("browse")
        b.open_message(ids["travel-2026:8"], "travel-2026")
        wait(lambda: (b.browse.current_message() or {}).get("message_id") == ids["travel-2026:8"])
        b.delete_selected()
        wait(lambda: b.delete_confirmation is not None)
        box = b.delete_confirmation
        assert box is not None
        shot(box, "delete-confirm.png")
        box.reject()
        wait(lambda: b.delete_confirmation is None)

        b.show_page("maintenance")
        wait(lambda: b.page_of(MaintenancePanel).health is not None)
        b.page_of(MaintenancePanel).rebuild()
        wait(lambda: b.page_of(MaintenancePanel).last_rebuild is not None)
        wait(lambda: not b.runner.busy)
        shot(b, "maintenance.png")

        b.apply_color_scheme(Qt.ColorScheme.Dark)
        b.show_page("browse")
        b.open_message(ids["project-atlas:2"], "project-atlas")
        wait(lambda: (b.browse.current_message() or {}).get("message_id") == ids["project-atlas:2"])
        b.browse.detail_tabs.setCurrentIndex(DETAIL_MESSAGE)
        shot(b, "browse-dark.png")
        b.show_page("maintenance")
        pump(300)
        shot(b, "maintenance-dark.png")

        b.close()
        b.shutdown()
        svc.close()

    portability_scenes(shot, wait, pump)


def portability_scenes(shot: Any, wait: Any, pump: Any) -> None:
    """Issue 16's views: the welcome page, the Hosts tab, import, backup, bulk curation."""
    from PySide6.QtCore import QSettings

    from convmem_app.backup_schedule import BackupScheduler
    from convmem_app.browser import MemoryBrowser
    from convmem_app.browser.portability import Portability
    from convmem_app.hosts import Env
    from convmem_engine.runtime.activity import CURRENT_CLIENT, ActivityLog
    from convmem_engine.runtime.clients import ClientRegistry
    from convmem_engine.service import MemoryService

    sys.path.insert(0, str(ROOT / "tests" / "transfer"))
    from export_samples import chatgpt_export, write_json

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        (home / ".cursor").mkdir(parents=True)
        (home / ".codex").mkdir()
        (home / ".config" / "Claude").mkdir(parents=True)
        (home / ".config" / "Claude" / "claude_desktop_config.json").write_text(
            '{"mcpServers": {"convmem": {"command": "/old/place/convmem-shim", "args": []}}}'
        )
        env = Env(home, {"PATH": ""}, "linux")
        data = Path(tmp) / "data"
        svc = MemoryService.open(data)
        settings = QSettings(str(Path(tmp) / "settings.ini"), QSettings.Format.IniFormat)
        registry = ClientRegistry()
        feed = ActivityLog(svc, registry)
        b = MemoryBrowser(svc, settings=settings)
        sched = BackupScheduler(str(data), settings)
        p = Portability(
            b,
            data_dir=data,
            scheduler=sched,
            clients=registry.clients,
            activity=feed,
            env_factory=lambda: env,
        )
        b.resize(1280, 820)
        b.show()
        wait(lambda: p.showing_welcome and p.welcome_setup.statuses)
        shot(b, "welcome.png")

        desktop = registry.connect("pipe")
        desktop.identify("claude-ai", "0.14.1")
        code = registry.connect("pipe")
        code.identify("claude-code", "2.1.4")
        for who, session, text in (
            (desktop, "trip-planning", "Remember: I prefer window seats on trains."),
            (code, "repo-atlas", "The storage engine is an append-only log."),
            (desktop, "trip-planning", "Booked the Nozomi to Kyoto on the 14th."),
        ):
            token = CURRENT_CLIENT.set(who.client_id)
            try:
                svc.write_message(session_id=session, role="user", content=text)
            finally:
                CURRENT_CLIENT.reset(token)
        b.tabs.setCurrentWidget(p.hosts_page)
        wait(lambda: p.hosts_page.feed.count() == 3 and p.hosts_setup.statuses)
        shot(b, "hosts.png")

        src = Path(tmp) / "conversations.json"
        write_json(src, chatgpt_export(40, 12))
        dialog = p.open_import()
        dialog.path.setText(str(src))
        dialog.dry_run()
        wait(lambda: dialog.import_button.isEnabled())
        shot(dialog, "import.png")
        dialog.close()

        backup = p.open_backup()
        assert backup is not None
        backup.backup_now()
        wait(lambda: backup.open_button.isEnabled())
        shot(backup, "backup.png")
        backup.close()

        b.tabs.setCurrentIndex(0)
        b.browse.select_session("trip-planning")
        wait(lambda: b.browse.history_model.rowCount() == 2 and not b.browse.history_model.loading)
        b.browse.history_view.selectAll()
        bulk = p.open_bulk()
        assert bulk is not None
        bulk.tier.setCurrentText("long")
        bulk.add_tags.setText("travel, japan")
        pump()
        shot(bulk, "bulk-edit.png")
        bulk.reject()

        p.stop()
        sched.stop()
        b.close()
        b.shutdown()
        feed.close()
        svc.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--only", nargs="*", default=[], help="save only these file names")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.inner:
        inner(args.out.resolve(), set(args.only))
        return 0
    ensure_xvfb()
    xvfb, display = start_xvfb()
    try:
        env = dict(os.environ, DISPLAY=display, QT_QPA_PLATFORM="xcb")
        env.pop("WAYLAND_DISPLAY", None)
        return subprocess.run(
            [sys.executable, __file__, "--inner", "--out", str(args.out), "--only", *args.only],
            env=env,
            check=False,
        ).returncode
    finally:
        xvfb.terminate()
        xvfb.wait(5)


if __name__ == "__main__":
    sys.exit(main())

"""Search: query and the filters of `search_messages`, results with score and matched fields."""

from __future__ import annotations

import html
import json
import re
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import (
    QModelIndex,
    QObject,
    QRectF,
    QSize,
    Qt,
    QTimer,
    Signal,
)
from PySide6.QtGui import (
    QAbstractTextDocumentLayout,
    QPainter,
    QPalette,
    QStandardItemModel,
    QTextDocument,
)
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from convmem_app.browser import format as fmt
from convmem_app.browser import theme
from convmem_app.browser.bulk import Target
from convmem_app.browser.metadata_form import split_tags
from convmem_app.browser.page import BrowserPage, PageContext
from convmem_app.browser.paged_model import KEY_ROLE, ROW_ROLE
from convmem_app.browser.table_model import AnyIndex, HeaderTableModel
from convmem_engine.domain import limits
from convmem_engine.domain.message import MEMORY_KINDS, MEMORY_TIERS

if TYPE_CHECKING:
    pass

HTML_ROLE = Qt.ItemDataRole.UserRole + 20
HTML_SELECTED_ROLE = Qt.ItemDataRole.UserRole + 21  # the same without a background colour
SNIPPET_CHARS = 180


def query_terms(query: str) -> list[str]:
    """Highlight the whole query and each word of it (longest first)."""
    words = {w for w in query.split() if w}
    words.add(query.strip())
    return sorted((w for w in words if w), key=len, reverse=True)


def highlight(text: str, terms: list[str], background: str) -> str:
    """HTML of `text` with every case-insensitive occurrence of a term marked."""
    if not terms:
        return html.escape(text)
    pattern = re.compile("|".join(re.escape(t) for t in terms), re.IGNORECASE)
    out: list[str] = []
    pos = 0
    style = f"background:{background}" if background else "text-decoration:underline"
    for m in pattern.finditer(text):
        out.append(html.escape(text[pos : m.start()]))
        out.append(f'<span style="{style}"><b>{html.escape(m.group())}</b></span>')
        pos = m.end()
    out.append(html.escape(text[pos:]))
    return "".join(out)


def snippet(text: str, terms: list[str], width: int = SNIPPET_CHARS) -> str:
    """A one-line window of `text` around the first match."""
    flat = " ".join(text.split())
    lower = flat.lower()
    first = min((i for i in (lower.find(t.lower()) for t in terms) if i >= 0), default=-1)
    if first < 0 or len(flat) <= width:
        return fmt.one_line(flat, width)
    start = max(0, first - width // 3)
    piece = flat[start : start + width]
    return ("…" if start else "") + piece + ("…" if start + width < len(flat) else "")


class SearchResultsModel(HeaderTableModel):
    HEADERS = ("Score", "Matched", "Session", "Time", "Kind", "Tier", "Imp.", "Match")
    COL_MATCH = 7

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.results: list[dict[str, Any]] = []
        self.terms: list[str] = []
        self.background = "#fde68a"

    def set_results(self, results: list[dict[str, Any]], query: str) -> None:
        self.beginResetModel()
        self.results = results
        self.terms = query_terms(query)
        self.endResetModel()

    def row_total(self) -> int:
        return len(self.results)

    def _match_text(self, r: dict[str, Any]) -> str:
        matched = r.get("matched_fields", [])
        meta = r.get("metadata", {})
        if "content" in matched or not matched:
            return snippet(str(r.get("content", "")), self.terms)
        if "summary" in matched and meta.get("summary"):
            return "summary: " + snippet(str(meta["summary"]), self.terms)
        return "tags: " + ", ".join(meta.get("tags", []))

    def data(self, index: AnyIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        r = self.results[index.row()]
        meta = r.get("metadata", {})
        col = index.column()
        if role == KEY_ROLE:
            return r["message_id"]
        if role == ROW_ROLE:
            return r
        if role == Qt.ItemDataRole.DisplayRole:
            return (
                f"{float(r.get('score', 0.0)):.3f}",
                ", ".join(r.get("matched_fields", [])),
                r.get("session_id"),
                fmt.time_text(r.get("timestamp")),
                meta.get("memory_kind"),
                meta.get("memory_tier"),
                meta.get("importance"),
                self._match_text(r),
            )[col]
        if role == HTML_ROLE and col == self.COL_MATCH:
            return highlight(self._match_text(r), self.terms, self.background)
        if role == HTML_SELECTED_ROLE and col == self.COL_MATCH:
            return highlight(self._match_text(r), self.terms, "")
        if role == Qt.ItemDataRole.ToolTipRole and col == 0:
            breakdown = r.get("score_breakdown", {})
            return "\n".join(f"{k}: {v:.3f}" for k, v in breakdown.items())
        return None


class HighlightDelegate(QStyledItemDelegate):
    """Paints HTML_ROLE rich text (the highlighted match) inside a normal item cell."""

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: AnyIndex) -> None:
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        selected = bool(opt.state & QStyle.StateFlag.State_Selected)
        rich = index.data(HTML_SELECTED_ROLE if selected else HTML_ROLE)
        if not rich:
            super().paint(painter, option, index)
            return
        opt.text = ""
        style = opt.widget.style() if opt.widget is not None else None
        if style is not None:
            style.drawControl(QStyle.ControlElement.CE_ItemViewItem, opt, painter, opt.widget)
        doc = QTextDocument()
        doc.setDefaultFont(opt.font)
        doc.setDocumentMargin(2)
        doc.setHtml(rich)
        ctx = QAbstractTextDocumentLayout.PaintContext()
        role = QPalette.ColorRole.HighlightedText if selected else QPalette.ColorRole.Text
        ctx.palette.setColor(QPalette.ColorRole.Text, opt.palette.color(role))
        painter.save()
        rect = opt.rect
        top = rect.top() + max(0, (rect.height() - int(doc.size().height())) // 2)
        painter.translate(rect.left(), top)
        painter.setClipRect(QRectF(0, 0, rect.width(), rect.height()))
        doc.documentLayout().draw(painter, ctx)
        painter.restore()

    def sizeHint(self, option: QStyleOptionViewItem, index: AnyIndex) -> QSize:
        size = super().sizeHint(option, index)
        return QSize(size.width(), max(size.height(), option.fontMetrics.height() + 6))


class SearchPanel(BrowserPage):
    """The Search page: every filter of `search_messages`, results with highlighted matches;
    opening a result shows it in its session (`openRequested`)."""

    name = "search"
    title = "Sea&rch"

    searched = Signal(int)  # number of results shown
    searchFailed = Signal(str)

    def __init__(self, context: PageContext, parent: QWidget | None = None) -> None:
        super().__init__(context, parent)
        self.current_session: str | None = None

        self.query = QLineEdit()
        self.query.setPlaceholderText("Search content, summaries and tags…  (Ctrl+F)")
        self.query.setClearButtonEnabled(True)
        self.search_button = QPushButton("Search")
        self.kind_boxes = {k: QCheckBox(k) for k in MEMORY_KINDS}
        self.tier_boxes = {t: QCheckBox(t) for t in MEMORY_TIERS}
        self.tags = QLineEdit()
        self.tags.setPlaceholderText("all of these tags, comma-separated")
        self.min_importance = QSpinBox()
        self.min_importance.setRange(limits.IMPORTANCE_MIN, limits.IMPORTANCE_MAX)
        self.scope = QComboBox()
        self.scope.addItem("All sessions")
        self.scope.addItem("Selected session")
        self.limit = QSpinBox()
        self.limit.setRange(limits.SEARCH_LIMIT_MIN, limits.SEARCH_LIMIT_MAX)
        self.limit.setValue(limits.SEARCH_LIMIT_DEFAULT)
        self.status = QLabel()

        top = QHBoxLayout()
        top.addWidget(self.query, 1)
        top.addWidget(self.search_button)
        filters = QGridLayout()
        for line, (label, boxes) in enumerate(
            (("Kinds:", self.kind_boxes), ("Tiers:", self.tier_boxes))
        ):
            filters.addWidget(QLabel(label), line, 0)
            boxes_row = QHBoxLayout()
            for box in boxes.values():
                boxes_row.addWidget(box)
            boxes_row.addStretch(1)
            filters.addLayout(boxes_row, line, 1, 1, 5)
        tags_label = QLabel("&Tags:")
        tags_label.setBuddy(self.tags)
        filters.addWidget(tags_label, 2, 0)
        filters.addWidget(self.tags, 2, 1)
        imp_label = QLabel("Min &importance:")
        imp_label.setBuddy(self.min_importance)
        filters.addWidget(imp_label, 2, 2)
        filters.addWidget(self.min_importance, 2, 3)
        filters.addWidget(self.scope, 2, 4)
        limit_row = QHBoxLayout()
        limit_row.addWidget(QLabel("Limit:"))
        limit_row.addWidget(self.limit)
        filters.addLayout(limit_row, 2, 5)
        filters.setColumnStretch(1, 1)

        self.model = SearchResultsModel(self)
        self.view = QTableView()
        self.view.setObjectName("searchResults")
        self.view.setModel(self.model)
        self.view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.view.setItemDelegateForColumn(SearchResultsModel.COL_MATCH, HighlightDelegate(self))
        self.view.verticalHeader().hide()
        self.view.setAlternatingRowColors(True)
        self.view.setWordWrap(False)
        header = self.view.horizontalHeader()
        header.setStretchLastSection(True)
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        for col, width in enumerate((60, 110, 140, 120, 90, 60, 45)):
            self.view.setColumnWidth(col, width)
        self.view.activated.connect(self._open_index)
        self.view.selectionModel().selectionChanged.connect(
            lambda _a, _b: self.selectionChanged.emit()
        )

        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addLayout(filters)
        layout.addWidget(self.view, 1)
        layout.addWidget(self.status)

        self._debounce = QTimer(self)
        self._debounce.setSingleShot(True)
        self._debounce.setInterval(300)
        self._debounce.timeout.connect(self.search)
        self.query.returnPressed.connect(self.search)
        self.search_button.clicked.connect(self.search)
        self.query.textEdited.connect(lambda _t: self._debounce.start())
        for box in (*self.kind_boxes.values(), *self.tier_boxes.values()):
            box.toggled.connect(self._rerun)
        self.tags.editingFinished.connect(self._rerun)
        self.min_importance.valueChanged.connect(self._rerun)
        self.scope.currentIndexChanged.connect(self._rerun)
        self.limit.valueChanged.connect(self._rerun)
        self.set_current_session(None)
        self.apply_palette()

    def apply_palette(self) -> None:
        self.model.background = theme.match_background(self.palette()).name()
        self.view.viewport().update()

    # ---- the page's hooks ----

    def focus(self) -> None:
        self.query.setFocus()
        self.query.selectAll()

    def refresh(self, current: bool) -> None:
        if current and self.query.text().strip():
            self.search()

    def delete_targets(self) -> list[Target]:
        rows = sorted({i.row() for i in self.view.selectionModel().selectedRows()})
        results = self.model.results
        return [
            Target(
                str(results[r]["message_id"]),
                int(results[r]["revision"]),
                str(results[r]["session_id"]),
            )
            for r in rows
        ]

    def messages_deleted(self, message_ids: set[str]) -> None:
        kept = [r for r in self.model.results if r["message_id"] not in message_ids]
        if len(kept) != len(self.model.results):
            self.model.set_results(kept, self.query.text())

    def set_current_session(self, session_id: str | None) -> None:
        self.current_session = session_id
        model = self.scope.model()
        if isinstance(model, QStandardItemModel) and (item := model.item(1)) is not None:
            item.setEnabled(session_id is not None)
        self.scope.setItemText(1, f"Session {session_id}" if session_id else "Selected session")
        if session_id is None and self.scope.currentIndex() == 1:
            self.scope.setCurrentIndex(0)

    def filters(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        kinds = [k for k, b in self.kind_boxes.items() if b.isChecked()]
        tiers = [t for t, b in self.tier_boxes.items() if b.isChecked()]
        tags = split_tags(self.tags.text())
        if kinds:
            out["kinds"] = kinds
        if tiers:
            out["tiers"] = tiers
        if tags:
            out["tags"] = tags
        return out

    def _rerun(self, *_args: object) -> None:
        if self.query.text().strip():
            self.search()

    def search(self) -> None:
        self._debounce.stop()
        query = self.query.text().strip()
        if not query:
            return
        if len(query.encode("utf-8")) > limits.QUERY_MAX_BYTES:
            self.status.setText(f"query: at most {limits.QUERY_MAX_BYTES} UTF-8 bytes")
            return
        args: dict[str, Any] = {
            "query": query,
            "min_importance": self.min_importance.value(),
            "limit": self.limit.value(),
        }
        filters = self.filters()
        if filters:
            args["filters_json"] = json.dumps(filters, ensure_ascii=False)
        if self.scope.currentIndex() == 1 and self.current_session:
            args["session_id"] = self.current_session
        tools = self._tools
        self.status.setText("Searching…")

        def done(result: dict[str, Any]) -> None:
            results = list(result.get("results", []))
            self.model.set_results(results, query)
            self.status.setText(
                f"{len(results)} result{'s' if len(results) != 1 else ''}"
                + (" — Enter opens the selected result in its session" if results else "")
            )
            if results:
                self.view.selectRow(0)
            self.searched.emit(len(results))

        def failed(exc: BaseException) -> None:
            self.status.setText(f"Search failed: {exc}")
            self.searchFailed.emit(str(exc))

        self._run_latest(lambda _j: tools.call("search_messages", args), done, failed)

    def open_row(self, row: int) -> None:
        r = self.model.results[row]
        self.openRequested.emit(str(r["message_id"]), str(r["session_id"]))

    def _open_index(self, index: QModelIndex) -> None:
        if index.isValid():
            self.open_row(index.row())

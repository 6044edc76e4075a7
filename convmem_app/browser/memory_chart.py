"""A custom-painted bar chart of `memory_estimate`: one stacked bar plus one row per part."""

from __future__ import annotations

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QColor, QPainter, QPaintEvent, QPalette
from PySide6.QtWidgets import QSizePolicy, QWidget

from convmem_app.browser import format as fmt
from convmem_app.browser import theme

PARTS = (
    ("store_entries_bytes", "Store entries"),
    ("body_bytes", "Message bodies"),
    ("metadata_bytes", "Metadata"),
    ("search_index_bytes", "Search index"),
    ("history_index_bytes", "History index"),
    ("relation_index_bytes", "Relation index"),
)


class MemoryChart(QWidget):
    ROW = 22
    STACK = 18

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.estimate: dict[str, int] = {}
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setMinimumHeight(self.sizeHint().height())
        self.setAccessibleName("Memory estimate chart")

    def set_estimate(self, estimate: dict[str, int]) -> None:
        self.estimate = dict(estimate)
        total = fmt.bytes_text(self.total)
        self.setToolTip(
            f"Total {total}\n"
            + "\n".join(f"{label}: {fmt.bytes_text(self.estimate.get(k, 0))}" for k, label in PARTS)
        )
        self.update()

    @property
    def total(self) -> int:
        return int(self.estimate.get("total_bytes", 0)) or sum(
            int(self.estimate.get(k, 0)) for k, _l in PARTS
        )

    def sizeHint(self) -> QSize:
        return QSize(420, self.STACK + 12 + self.ROW * len(PARTS) + 8)

    def paintEvent(self, event: QPaintEvent) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        pal = self.palette()
        colors = theme.accent_colors(pal)
        text = pal.color(QPalette.ColorRole.WindowText)
        track = pal.color(QPalette.ColorRole.AlternateBase)
        width = float(self.width())
        total = max(self.total, 1)
        # stacked composition bar
        x = 0.0
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(track)
        p.drawRoundedRect(QRectF(0, 0, width, self.STACK), 4, 4)
        for i, (key, _label) in enumerate(PARTS):
            w = width * int(self.estimate.get(key, 0)) / total
            if w > 0:
                p.setBrush(colors[i % len(colors)])
                p.drawRect(QRectF(x, 0, w, self.STACK))
                x += w
        # one row per part: swatch, label, bar, value
        fm = self.fontMetrics()
        label_w = max(fm.horizontalAdvance(label) for _k, label in PARTS) + 24
        value_w = fm.horizontalAdvance("1023.9 MiB  100%") + 8
        bar_w = max(20.0, width - label_w - value_w)
        biggest = max((int(self.estimate.get(k, 0)) for k, _l in PARTS), default=0) or 1
        y = float(self.STACK + 12)
        for i, (key, label) in enumerate(PARTS):
            value = int(self.estimate.get(key, 0))
            color = QColor(colors[i % len(colors)])
            p.setPen(Qt.PenStyle.NoPen)
            p.setBrush(color)
            p.drawRoundedRect(QRectF(0, y + 5, 12, 12), 2, 2)
            p.setPen(text)
            p.drawText(
                QRectF(18, y, label_w - 18, self.ROW),
                Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft,
                label,
            )
            p.setPen(Qt.PenStyle.NoPen)
            p.setBrush(track)
            p.drawRoundedRect(QRectF(label_w, y + 4, bar_w, self.ROW - 8), 3, 3)
            p.setBrush(color)
            p.drawRoundedRect(QRectF(label_w, y + 4, bar_w * value / biggest, self.ROW - 8), 3, 3)
            p.setPen(text)
            share = 100.0 * value / total
            p.drawText(
                QRectF(label_w + bar_w + 8, y, value_w - 8, self.ROW),
                Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignRight,
                f"{fmt.bytes_text(value)}  {share:.0f}%",
            )
            y += self.ROW
        p.end()

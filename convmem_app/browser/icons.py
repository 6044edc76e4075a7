"""Action icons as SVG drawn at whatever size and device-pixel ratio Qt asks for.

The SVG sources live here as strings (so they ship with the package and need no resource
compiler). `currentColor` is replaced with the palette's text colour when the icon is made, so
the icons stay legible in light and dark palettes; the window re-creates them when the colour
scheme changes.
"""

from __future__ import annotations

from PySide6.QtCore import QByteArray, QPoint, QRect, QSize, Qt
from PySide6.QtGui import QColor, QIcon, QIconEngine, QPainter, QPixmap
from PySide6.QtSvg import QSvgRenderer

_HEAD = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" fill="none" '
    'stroke="currentColor" stroke-width="2" stroke-linecap="round" stroke-linejoin="round">'
)

SVG: dict[str, str] = {
    "refresh": '<path d="M20 11a8 8 0 1 0-2.3 5.7"/><path d="M20 4v7h-7"/>',
    "search": '<circle cx="10.5" cy="10.5" r="6.5"/><path d="M15.5 15.5 21 21"/>',
    "delete": (
        '<path d="M4 7h16"/><path d="M9 7V4h6v3"/><path d="M6 7l1 13h10l1-13"/>'
        '<path d="M10 11v6M14 11v6"/>'
    ),
    "rebuild": (
        '<path d="M4 20h16"/><rect x="5" y="13" width="4" height="5"/>'
        '<rect x="10" y="9" width="4" height="9"/><rect x="15" y="5" width="4" height="13"/>'
    ),
    "health": '<path d="M3 12h4l2-5 4 10 2-5h6"/>',
    "save": (
        '<path d="M5 3h11l4 4v14H4V3z"/><path d="M8 3v5h8V3"/><rect x="8" y="13" width="8" '
        'height="6"/>'
    ),
    "revert": '<path d="M9 5 4 10l5 5"/><path d="M4 10h10a6 6 0 0 1 0 12h-3"/>',
    "cancel": '<path d="M6 6l12 12M18 6 6 18"/>',
    "session": '<path d="M4 5h16v11H9l-5 4z"/>',
    "message": '<rect x="3" y="4" width="18" height="16" rx="2"/><path d="M7 9h10M7 13h7"/>',
    "link": (
        '<path d="M10 14a4 4 0 0 0 5.7 0l3-3a4 4 0 0 0-5.7-5.7l-1 1"/>'
        '<path d="M14 10a4 4 0 0 0-5.7 0l-3 3a4 4 0 0 0 5.7 5.7l1-1"/>'
    ),
    "add": '<path d="M12 5v14M5 12h14"/>',
    "remove": '<path d="M5 12h14"/>',
    "app": (
        '<path d="M4 5h16v11H9l-5 4z" fill="#3b82f6" stroke="#1d4ed8"/>'
        '<path d="M8 9h8M8 12h5" stroke="#ffffff"/>'
    ),
}


class SvgIconEngine(QIconEngine):
    """Renders one SVG sharply at any logical size and device-pixel ratio."""

    def __init__(self, svg: bytes) -> None:
        super().__init__()
        self._svg = svg
        self._renderer = QSvgRenderer(QByteArray(svg))

    def paint(self, painter: QPainter, rect: QRect, mode: QIcon.Mode, state: QIcon.State) -> None:
        if mode == QIcon.Mode.Disabled:
            painter.setOpacity(0.4)
        self._renderer.render(painter, rect.toRectF())

    def pixmap(self, size: QSize, mode: QIcon.Mode, state: QIcon.State) -> QPixmap:
        return self.scaledPixmap(size, mode, state, 1.0)

    def scaledPixmap(
        self, size: QSize, mode: QIcon.Mode, state: QIcon.State, scale: float
    ) -> QPixmap:
        device = QSize(max(1, round(size.width() * scale)), max(1, round(size.height() * scale)))
        pm = QPixmap(device)
        pm.fill(Qt.GlobalColor.transparent)
        painter = QPainter(pm)
        self.paint(painter, QRect(QPoint(0, 0), device), mode, state)
        painter.end()
        pm.setDevicePixelRatio(scale)
        return pm

    def clone(self) -> QIconEngine:
        return SvgIconEngine(self._svg)


def make_icon(name: str, color: QColor) -> QIcon:
    svg = (_HEAD.replace("currentColor", color.name()) + SVG[name] + "</svg>").encode()
    return QIcon(SvgIconEngine(svg))

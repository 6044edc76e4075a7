"""Light and dark palettes that follow the system colour scheme.

Qt's styles adapt to the platform theme on most desktops; where the platform reports a dark
scheme but the style still hands out a light palette (plain X11, some Fusion setups), the
window applies `dark_palette()` itself. Custom-painted widgets read colours from the palette, so
they follow either way.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette

ColorScheme = Qt.ColorScheme


def system_scheme() -> Qt.ColorScheme:
    hints = QGuiApplication.styleHints()
    return hints.colorScheme() if hints is not None else Qt.ColorScheme.Unknown


def is_dark(palette: QPalette) -> bool:
    return palette.color(QPalette.ColorRole.Window).lightness() < 128


def dark_palette() -> QPalette:
    p = QPalette()
    group_colors = {
        QPalette.ColorRole.Window: QColor(37, 38, 41),
        QPalette.ColorRole.WindowText: QColor(226, 228, 232),
        QPalette.ColorRole.Base: QColor(27, 28, 30),
        QPalette.ColorRole.AlternateBase: QColor(44, 46, 50),
        QPalette.ColorRole.ToolTipBase: QColor(50, 52, 56),
        QPalette.ColorRole.ToolTipText: QColor(226, 228, 232),
        QPalette.ColorRole.PlaceholderText: QColor(140, 144, 150),
        QPalette.ColorRole.Text: QColor(226, 228, 232),
        QPalette.ColorRole.Button: QColor(48, 50, 54),
        QPalette.ColorRole.ButtonText: QColor(226, 228, 232),
        QPalette.ColorRole.BrightText: QColor(255, 110, 110),
        QPalette.ColorRole.Light: QColor(70, 72, 78),
        QPalette.ColorRole.Midlight: QColor(58, 60, 65),
        QPalette.ColorRole.Mid: QColor(40, 42, 45),
        QPalette.ColorRole.Dark: QColor(20, 21, 23),
        QPalette.ColorRole.Shadow: QColor(0, 0, 0),
        QPalette.ColorRole.Highlight: QColor(59, 130, 246),
        QPalette.ColorRole.HighlightedText: QColor(255, 255, 255),
        QPalette.ColorRole.Link: QColor(110, 168, 254),
        QPalette.ColorRole.LinkVisited: QColor(170, 140, 250),
    }
    for role, color in group_colors.items():
        p.setColor(QPalette.ColorGroup.All, role, color)
    disabled = QColor(120, 123, 128)
    for role in (
        QPalette.ColorRole.WindowText,
        QPalette.ColorRole.Text,
        QPalette.ColorRole.ButtonText,
    ):
        p.setColor(QPalette.ColorGroup.Disabled, role, disabled)
    return p


def palette_for(scheme: Qt.ColorScheme, base: QPalette) -> QPalette | None:
    """The palette the window should use, or None to keep the style's own palette."""
    if scheme == Qt.ColorScheme.Dark and not is_dark(base):
        return dark_palette()
    return None


def accent_colors(palette: QPalette) -> list[QColor]:
    """Distinct series colours, brightened on dark backgrounds."""
    light = ["#2563eb", "#16a34a", "#d97706", "#9333ea", "#dc2626", "#0891b2", "#4b5563"]
    dark = ["#60a5fa", "#4ade80", "#fbbf24", "#c084fc", "#f87171", "#22d3ee", "#9ca3af"]
    return [QColor(c) for c in (dark if is_dark(palette) else light)]


def error_color(palette: QPalette) -> QColor:
    return QColor("#f87171") if is_dark(palette) else QColor("#b91c1c")


def ok_color(palette: QPalette) -> QColor:
    return QColor("#4ade80") if is_dark(palette) else QColor("#15803d")


def match_background(palette: QPalette) -> QColor:
    return QColor("#854d0e") if is_dark(palette) else QColor("#fde68a")

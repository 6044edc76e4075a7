"""Small parts of the browser: HiDPI icons, the memory chart, the editor's form rules."""

from __future__ import annotations

from typing import Any

import pytest
from PySide6.QtCore import QSize
from PySide6.QtGui import QColor, QImage

from convmem_app.browser.icons import SVG, make_icon
from convmem_app.browser.memory_chart import PARTS, MemoryChart
from convmem_app.browser.metadata_form import MetadataForm, split_tags, validate

pytestmark = pytest.mark.gui


@pytest.mark.parametrize("name", sorted(SVG))
def test_icons_render_sharp_at_any_device_pixel_ratio(qtbot: Any, name: str) -> None:
    icon = make_icon(name, QColor("#202020"))
    for dpr in (1.0, 2.0, 3.0):
        pm = icon.pixmap(QSize(24, 24), dpr)
        assert pm.devicePixelRatio() == dpr
        assert pm.width() == round(24 * dpr)  # drawn at device resolution, not scaled up
        image = pm.toImage().convertToFormat(QImage.Format.Format_ARGB32)
        opaque = sum(
            1
            for y in range(image.height())
            for x in range(image.width())
            if image.pixelColor(x, y).alpha() > 0
        )
        assert opaque > 0


def test_memory_chart_paints_every_part(qtbot: Any) -> None:
    chart = MemoryChart()
    qtbot.addWidget(chart)
    estimate = {"total_bytes": 2100} | {key: (i + 1) * 100 for i, (key, _l) in enumerate(PARTS)}
    chart.set_estimate(estimate)
    chart.resize(500, chart.sizeHint().height())
    image = chart.grab().toImage()
    assert not image.isNull()
    assert chart.total == 2100
    for _key, label in PARTS:
        assert label in chart.toolTip()


def test_form_rules_are_the_services() -> None:
    assert split_tags(" a, ,b ,") == ["a", "b"]
    ok = MetadataForm(tags=["x"], relations=[("supersedes", "01ARZ3NDEKTSV4RRFFQ69G5FAV")])
    assert validate(ok) == {}
    bad = MetadataForm(
        tags=["t"] * 33,
        summary="é" * 2049,  # 4098 bytes
        relations=[("supersedes", "01arz3ndektsv4rrffq69g5fav")],  # not canonical
        source_message_ids=["nope"],
    )
    errors = validate(bad)
    assert set(errors) == {"tags", "summary", "relations", "source_message_ids"}
    assert errors["tags"].startswith("tags:") and "32" in errors["tags"]
    assert "4096" in errors["summary"] and "é" not in errors["summary"]
    assert errors["relations"].startswith("relations[0].message_id")

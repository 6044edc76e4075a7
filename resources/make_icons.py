"""Render the ConvMem icon: PNG per size and a multi-size .ico from `convmem.svg`.

Run after editing the SVG: `.venv/bin/python resources/make_icons.py`. Writes into
`resources/` (installer, README) and `convmem_app/resources/` (loaded by the app at runtime).
"""

from __future__ import annotations

import os
import shutil
import struct
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, Qt
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parent / "convmem_app" / "resources"
SIZES = (16, 24, 32, 48, 64, 128, 256)
ICO_SIZES = (16, 24, 32, 48, 64, 128, 256)


def render(renderer: QSvgRenderer, size: int) -> QImage:
    image = QImage(size, size, QImage.Format.Format_ARGB32)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter)
    painter.end()
    return image


def png_bytes(image: QImage) -> bytes:
    data = QByteArray()
    buffer = QBuffer(data)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buffer, "PNG")
    return bytes(data.data())


def write_ico(path: Path, images: dict[int, bytes]) -> None:
    """An .ico holding PNG-compressed images (valid since Windows Vista)."""
    header = struct.pack("<HHH", 0, 1, len(images))
    entries, blobs = b"", b""
    offset = 6 + 16 * len(images)
    for size, blob in sorted(images.items()):
        dim = 0 if size >= 256 else size
        entries += struct.pack("<BBBBHHII", dim, dim, 0, 0, 1, 32, len(blob), offset + len(blobs))
        blobs += blob
    path.write_bytes(header + entries + blobs)


def main() -> int:
    _app = QGuiApplication(sys.argv[:1])
    renderer = QSvgRenderer(str(HERE / "convmem.svg"))
    if not renderer.isValid():
        print("convmem.svg: not a valid SVG", file=sys.stderr)
        return 1
    PACKAGE.mkdir(exist_ok=True)
    pngs = {size: png_bytes(render(renderer, size)) for size in SIZES}
    for size, blob in pngs.items():
        (HERE / f"convmem-{size}.png").write_bytes(blob)
        shutil.copyfile(HERE / f"convmem-{size}.png", PACKAGE / f"convmem-{size}.png")
    write_ico(HERE / "convmem.ico", {size: pngs[size] for size in ICO_SIZES})
    shutil.copyfile(HERE / "convmem.svg", PACKAGE / "convmem.svg")
    print(f"wrote {len(pngs)} PNGs, convmem.ico and copies in {PACKAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

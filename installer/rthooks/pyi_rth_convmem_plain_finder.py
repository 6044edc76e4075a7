"""Run-time hook of the bundled `ConvMem` and `convmem-cli` (installer/convmem.spec): Python's
own path finder for every import.

The build keeps no module in a PYZ archive (the spec's `noarchive=True`): every module is a
.pyc file under _internal/. PyInstaller's finder, which wraps each folder of the bundle to look
into that archive first, then only adds a Python-level detour to every import (measured: ~6 us
per module found, ~18 us per package folder, ~3 ms before `serve`'s handshake). This hook puts
Python's FileFinder back in its place, and leaves PyInstaller's finder alone if the archive has
any module.
"""


def _plain_finder() -> None:
    import sys

    try:  # PyInstaller's bootstrap module (the finder and the archive): its internals, which
        # another PyInstaller release may name otherwise; then its finder stays, as it works
        import pyimod02_importers

        if pyimod02_importers.pyz_archive.toc:
            return
        hook = pyimod02_importers.PyiFrozenFinder.path_hook
    except (ImportError, AttributeError):
        return
    sys.path_hooks[:] = [entry for entry in sys.path_hooks if entry != hook]
    for path, finder in list(sys.path_importer_cache.items()):
        if isinstance(finder, pyimod02_importers.PyiFrozenFinder):
            del sys.path_importer_cache[path]


_plain_finder()
del _plain_finder

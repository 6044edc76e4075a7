"""ConvMem desktop app: tray, memory browser, the local pipe bridge and the shim.

Qt is imported only by the modules that need it; `paths`, `cli` and `shim` use the standard
library alone so `convmem serve` and `convmem-shim` start fast and never load Qt.
"""

"""The tray app's shell: life cycle (`app`), the engine thread, the pipe bridge, the tray,
start-at-login and the startup error window. The memory browser lives in `convmem_app.browser`."""

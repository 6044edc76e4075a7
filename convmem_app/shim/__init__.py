"""`convmem-shim`: the standard-library launcher between an LLM host's stdio and the app's pipe.

`launcher` is the shim itself; `paths` derives the data dir and the pipe/socket endpoint (shared
with the app, so both sides agree on the name). Nothing here imports Qt, the MCP SDK or the
engine: the shim must start in tens of milliseconds.
"""

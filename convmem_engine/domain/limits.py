"""Every numeric limit of the tool reference (seed 000), in one place.

Validation (domain), the MCP JSON Schemas and the GUI's inline checks all read these names, so
a limit can only change here.
"""

from __future__ import annotations

from typing import Final

MIB: Final = 1024 * 1024

# write_message / update_message
SESSION_ID_MAX_BYTES: Final = 256
CONTENT_MAX_BYTES: Final = 1 * MIB
METADATA_JSON_MAX_BYTES: Final = 1 * MIB  # the JSON string itself; each field has its own limit

# metadata fields
TOOL_CALL_ID_MAX_BYTES: Final = 256
TAGS_MAX_ITEMS: Final = 32
TAG_MAX_BYTES: Final = 128
IMPORTANCE_MIN: Final = 0
IMPORTANCE_MAX: Final = 100
SUMMARY_MAX_BYTES: Final = 4096
RELATIONS_MAX_ITEMS: Final = 32
SOURCE_IDS_MAX_ITEMS: Final = 64
ULID_LENGTH: Final = 26

# read_messages
READ_LIMIT_MIN: Final = 1
READ_LIMIT_MAX: Final = 1000
READ_LIMIT_DEFAULT: Final = 100
CONTENT_LIMIT_MIN: Final = 1
CONTENT_LIMIT_MAX: Final = 65536
CONTENT_LIMIT_DEFAULT: Final = 4096
CONTEXT_NEIGHBOURS_MAX: Final = 10  # before / after
CONTEXT_NEIGHBOURS_DEFAULT: Final = 1
RELATION_DEPTH_MAX: Final = 2
RELATION_DEPTH_DEFAULT: Final = 1
CONTEXT_MAX_MESSAGES: Final = 50
RESPONSE_BUDGET_BYTES: Final = 8 * MIB  # "about 8 MiB" of serialized response

# search_messages
QUERY_MAX_BYTES: Final = 4096
SEARCH_CONTEXT_MAX: Final = 3
SEARCH_LIMIT_MIN: Final = 1
SEARCH_LIMIT_MAX: Final = 100
SEARCH_LIMIT_DEFAULT: Final = 20

# update_message / content view
EXPECTED_REVISION_MIN: Final = 1

"""The benchmark corpus: every message of the PyPI package `chitchat-dataset` (258,145 real chat
messages in 7,168 conversations), as (session_id, role, content) tuples in conversation order.

session_id is the conversation id; the conversation's first sender is "user", the other
"assistant". Shared by every bench script: `from corpus import load_corpus` (bench/ on sys.path,
as when running `python bench/bench_x.py`).
"""

from __future__ import annotations

import functools


@functools.cache
def load_corpus() -> tuple[tuple[str, str, str], ...]:
    import chitchat_dataset as ccc  # the optional "bench" dependency

    out: list[tuple[str, str, str]] = []
    for conversation_id, conversation in ccc.Dataset().items():
        first_sender: str | None = None
        for turn in conversation["messages"]:
            for m in turn:
                sender = m["sender"]
                if first_sender is None:
                    first_sender = sender
                role = "user" if sender == first_sender else "assistant"
                out.append((conversation_id, role, m["text"]))
    return tuple(out)


if __name__ == "__main__":
    corpus = load_corpus()
    sessions = {s for s, _, _ in corpus}
    text_bytes = sum(len(c.encode("utf-8")) for _, _, c in corpus)
    print(f"{len(corpus)} messages, {len(sessions)} sessions, {text_bytes / 1e6:.1f} MB of text")

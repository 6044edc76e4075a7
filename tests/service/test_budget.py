"""The response budget: bounds are upper bounds, and bounded measuring cuts exactly where
measuring every item would."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from convmem_engine.domain import Message, Metadata, Relation
from convmem_engine.service.budget import Budget, json_bytes, message_bound, text_bound

ULID = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
any_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=60)


@st.composite
def messages(draw: st.DrawFn) -> Message:
    md = Metadata(
        tool_call_id=draw(st.one_of(st.none(), any_text)),
        tags=tuple(draw(st.lists(any_text.filter(bool), max_size=5))),
        importance=draw(st.integers(0, 100)),
        summary=draw(st.one_of(st.none(), any_text)),
        relations=tuple(Relation("derived_from", ULID) for _ in range(draw(st.integers(0, 3)))),
        source_message_ids=(ULID,) * draw(st.integers(0, 3)),
    )
    return Message(
        ULID,
        draw(any_text.filter(bool)),
        2**45 + draw(st.integers(0, 2**40)),
        "assistant",
        draw(any_text.filter(bool)),
        draw(st.integers(1, 2**62)),
        2**46,
        md,
    )


@settings(max_examples=200)
@given(messages())
def test_message_bound_is_an_upper_bound(msg: Message) -> None:
    assert json_bytes(msg.to_json()) <= message_bound(msg)
    assert json_bytes(msg.content) <= text_bound(msg.content)


def test_control_characters_worst_case() -> None:
    msg = Message(ULID, "\x01" * 10, 1, "user", "\x1f" * 1000, 1, 1)
    assert json_bytes(msg.to_json()) <= message_bound(msg)


@settings(max_examples=200)
@given(st.lists(st.integers(1, 400), max_size=40), st.integers(50, 3000), st.integers(0, 5))
def test_bounded_budget_cuts_like_exact(sizes: list[int], limit: int, slack: int) -> None:
    items = ["x" * n for n in sizes]
    exact = Budget(10, limit)
    bounded = Budget(10, limit)
    n_exact = n_bounded = 0
    for item in items:
        if not exact.take(item):
            break
        n_exact += 1
    for item in items:
        if not bounded.take(item, json_bytes(item) * 2 + slack):
            break
        n_bounded += 1
    assert n_exact == n_bounded

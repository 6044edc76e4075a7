"""DocTable (index/doc_table.py): the search index's id -> document map, checked against a
dict on ascending ids (the usual case), out-of-order ids, holes, removals and re-adds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convmem_engine.index.doc_table import DocTable

# Short ids from a small alphabet: many collide, and "ascending" is often broken.
_ID = st.text(alphabet="abcde", min_size=1, max_size=3)


def _model(ids: list[str | None]) -> dict[str, int]:
    return {mid: doc for doc, mid in enumerate(ids) if mid is not None}


def _agrees(table: DocTable, ids: list[str | None], probes: list[str]) -> None:
    model = _model(ids)
    assert len(table) == len(model)
    assert dict(table.items()) == model
    for mid in [*model, *probes]:
        assert table.get(mid) == model.get(mid)
        assert (mid in table) == (mid in model)


@given(st.lists(st.one_of(st.none(), _ID)), st.lists(_ID, max_size=5))
def test_a_table_built_from_ids_finds_exactly_the_live_ones(
    raw: list[str | None], probes: list[str]
) -> None:
    live = [mid for mid in raw if mid is not None]
    if len(set(live)) != len(live):
        with pytest.raises(ValueError, match="twice"):
            DocTable(raw)
        return
    _agrees(DocTable(raw), raw, probes)


@settings(max_examples=400)
@given(
    st.one_of(
        st.lists(st.one_of(st.none(), _ID), max_size=30).filter(
            lambda ids: len({m for m in ids if m is not None}) == sum(m is not None for m in ids)
        ),
        # Ascending ids without holes (the usual case: keys and ids are one list).
        st.sets(_ID, max_size=30).map(sorted),
    ),
    st.lists(st.tuples(st.booleans(), _ID), max_size=40),
)
def test_adds_and_removes_keep_it_in_step_with_a_dict(
    start: list[str | None], ops: list[tuple[bool, str]]
) -> None:
    ids = list(start)
    table = DocTable(ids)
    for add, mid in ops:
        if add:
            if mid in table:
                continue
            ids.append(mid)
            table.add(mid, len(ids) - 1)
        else:
            doc = table.pop(mid)
            if doc is not None:
                assert ids[doc] is None
        _agrees(table, ids, [mid])
    # A table built again from the same list (a load) agrees too.
    _agrees(DocTable(ids), ids, [mid for _, mid in ops])


def test_ascending_ids_need_no_extra_entries() -> None:
    ids: list[str | None] = [f"{i:06d}" for i in range(1000)]
    table = DocTable(ids)
    assert not table._extra
    ids[10] = None
    table = DocTable(ids)  # a hole: still no extra entry
    assert not table._extra and table.get("000010") is None and table.get("000011") == 11
    ids.append("000005")  # an out-of-order id (e.g. imported): the only extra entry
    table.add("000005", 1000)
    assert table._extra == {"000005": 1000}
    assert table.get("000005") == 1000 and table.get("000999") == 999


def test_the_same_string_object_twice_is_refused() -> None:
    mid = "x" * 5
    with pytest.raises(ValueError, match="twice"):
        DocTable([mid, None, mid])
    with pytest.raises(ValueError, match="twice"):
        DocTable([mid, mid])

"""Compressed posting lists (convmem_engine/index/postings.py) against a plain sorted list.

Every operation the search planner uses (membership, ascending and descending walks, unordered
members, insertion, removal, the plain -> compressed promotion) is compared with the same
operation on a Python list/set, on lists that span several 65,536-document containers and
cross the container kinds' thresholds (array / bitmap at exactly 4,096 and from 16,384)."""

from __future__ import annotations

import random
from array import array

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from convmem_engine.index import postings as P
from convmem_engine.index.postings import BIG, BITMAP, DENSE, Postings

SPAN = 1 << 16
# Sizes of one container's documents: around each threshold of the container kinds.
SIZES = [0, 1, 2, 300, BITMAP - 1, BITMAP, BITMAP + 1, DENSE - 1, DENSE, DENSE + 1, 40_000, SPAN]


def container_docs(rng: random.Random, high: int, size: int) -> list[int]:
    base = high * SPAN
    return sorted(base + low for low in rng.sample(range(SPAN), size))


@st.composite
def doc_lists(draw: st.DrawFn) -> list[int]:
    rng = random.Random(draw(st.integers(0, 2**32)))
    highs = sorted(draw(st.sets(st.integers(0, 5), max_size=3)))
    docs: list[int] = []
    for high in highs:
        docs += container_docs(rng, high, draw(st.sampled_from(SIZES)))
    return docs


def kinds_follow_the_rule(p: Postings) -> bool:
    for h in range(len(p.at) - 1):
        width = p.at[h + 1] - p.at[h]
        card = p.cardinality(h)
        if (width == BITMAP) != (card >= DENSE or card == BITMAP):
            return False
    return True


def assert_same(p: Postings, docs: list[int], rng: random.Random) -> None:
    assert p.check() == ""
    assert kinds_follow_the_rule(p)
    assert len(p) == len(docs)
    assert list(p) == docs
    assert list(reversed(p)) == docs[::-1]
    got = list(P.members(p))
    assert len(got) == len(docs) and set(got) == set(docs)
    present = set(docs)
    probes = rng.sample(docs, min(200, len(docs))) + [rng.randrange(7 * SPAN) for _ in range(200)]
    for d in probes:
        assert p.contains(d) == (d in present)
        assert P.contains(p, d) == (d in present)
        assert P.checker(p)(d) == (d in present)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc_lists(), st.integers(0, 2**32))
def test_layout_equals_the_sorted_list(docs: list[int], seed: int) -> None:
    assert_same(Postings.of(docs), docs, random.Random(seed))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc_lists(), st.integers(0, 2**32), st.integers(1, 60))
def test_inserts_and_removals_equal_a_set(docs: list[int], seed: int, steps: int) -> None:
    rng = random.Random(seed)
    p = Postings.of(docs)
    model = set(docs)
    for _ in range(steps):
        # Mostly near existing documents, so container sizes move across the thresholds.
        near = bool(model) and rng.random() < 0.5
        d = rng.choice(sorted(model)) if near else rng.randrange(6 * SPAN)
        if rng.random() < 0.5:
            assert p.insert(d) == (d not in model)
            model.add(d)
        else:
            assert p.discard(d) == (d in model)
            model.discard(d)
    assert_same(p, sorted(model), rng)


@pytest.mark.parametrize("size", [BITMAP - 1, BITMAP, BITMAP + 1, DENSE - 1, DENSE, DENSE + 1])
def test_containers_change_kind_at_the_thresholds(size: int) -> None:
    rng = random.Random(size)
    docs = container_docs(rng, 1, size) + container_docs(rng, 2, 50)
    p = Postings.of(docs)
    model = set(docs)
    # Up across the thresholds, then back down, one document at a time.
    free = [d for d in range(SPAN, 2 * SPAN) if d not in model]
    for d in rng.sample(free, 3):
        assert p.insert(d)
        model.add(d)
        assert p.check() == "" and kinds_follow_the_rule(p)
    for d in rng.sample(sorted(model), 6):
        assert p.discard(d)
        model.discard(d)
        assert p.check() == "" and kinds_follow_the_rule(p)
    assert_same(p, sorted(model), rng)


def test_appends_in_order_build_the_same_layout() -> None:
    rng = random.Random(3)
    docs = sorted(rng.sample(range(3 * SPAN), 30_000)) + list(range(3 * SPAN, 3 * SPAN + 9000))
    p = Postings.of(docs[:1])
    for d in docs[1:]:
        p.append(d)
    q = Postings.of(docs)
    assert (p.at, p.data, p.n) == (q.at, q.data, q.n)
    assert_same(p, docs, rng)


def test_removing_everything_leaves_an_empty_list() -> None:
    rng = random.Random(4)
    docs = container_docs(rng, 0, DENSE) + container_docs(rng, 3, 10)
    p = Postings.of(docs)
    for d in rng.sample(docs, len(docs)):
        assert p.discard(d)
    assert len(p) == 0 and list(p) == [] and list(p.at) == [0] and not p.data
    assert not p.discard(5)


def test_plain_lists_use_the_same_functions_and_are_compressed_at_big() -> None:
    plain = array("I", range(0, 2 * (BIG - 1), 2))
    assert P.contains(plain, 4) and not P.contains(plain, 5)
    assert P.checker(plain)(6) and not P.checker(plain)(7)
    assert list(P.members(plain)) == list(plain)
    assert P.discard(plain, 4) and not P.discard(plain, 4)
    grown = P.insert(plain, 4)
    assert grown is plain and len(plain) == BIG - 1
    grown = P.insert(plain, 5)
    assert isinstance(grown, Postings) and len(grown) == BIG
    assert list(grown) == sorted([*range(0, 2 * (BIG - 1), 2), 5])
    assert P.nbytes(grown) > 0 and P.nbytes(plain) > 0


def test_walks_do_not_pin_the_buffers() -> None:
    # A walk left half-way (a search that stopped early) must not block the next write.
    docs = list(range(0, 5 * SPAN, 3))
    p = Postings.of(docs)
    walk = reversed(p)
    next(walk)
    up = iter(p)
    next(up)
    members = iter(P.members(p))
    next(members)
    p.append(5 * SPAN + 1)
    assert p.insert(4) and p.discard(4)
    assert list(p)[-1] == 5 * SPAN + 1

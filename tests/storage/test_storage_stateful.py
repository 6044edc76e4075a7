"""Random operations against a plain dict model, including close/reopen, crash/reopen and
compaction: after every step the store holds exactly the model, in creation order."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    rule,
)
from storage_helpers import RICH_METADATA

from convmem_engine.domain import DEFAULT_METADATA, Message, NotFoundError
from convmem_engine.storage import Store

texts = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=40)


class StoreMachine(RuleBasedStateMachine):
    ids = Bundle("ids")

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="convmem-stateful-")
        self.store = Store.open(self.dir)
        self.model: dict[str, Message] = {}
        self.n = 0

    def teardown(self) -> None:
        try:
            assert self.store.check() == []
        finally:
            # closed even when the check fails: an open store left to the garbage collector
            # reports its unclosed lock file in whichever later test collects it
            try:
                self.store.close()
            finally:
                shutil.rmtree(self.dir, ignore_errors=True)

    @rule(target=ids, content=texts, session=st.sampled_from(["a", "b", "c"]), rich=st.booleans())
    def put(self, content: str, session: str, rich: bool) -> str:
        self.n += 1
        mid = f"01J{self.n:023d}"
        m = Message(
            mid,
            session,
            self.n,
            "user",
            content,
            1,
            self.n,
            RICH_METADATA if rich else DEFAULT_METADATA,
        )
        self.store.put(m)
        self.model[mid] = m
        return mid

    @rule(mid=ids, content=texts)
    def update(self, mid: str, content: str) -> None:
        old = self.model.get(mid)
        if old is None:
            with pytest.raises(NotFoundError):
                self.store.update(Message(mid, "a", 1, "user", content, 2, 2))
            return
        new = Message(
            mid,
            old.session_id,
            old.timestamp,
            old.role,
            content,
            old.revision + 1,
            old.updated_at + 1,
            old.metadata,
        )
        self.store.update(new)
        self.model[mid] = new

    @rule(mid=consumes(ids))
    def delete(self, mid: str) -> None:
        if mid not in self.model:
            with pytest.raises(NotFoundError):
                self.store.delete(mid)
            return
        self.store.delete(mid)
        del self.model[mid]

    @rule()
    def close_and_reopen(self) -> None:
        self.store.close()
        self.store = Store.open(self.dir)
        assert self.store.stats().snapshot_valid
        assert self.store.check() == []

    @rule()
    def crash_and_reopen(self) -> None:
        self.store._abandon()  # as a killed process: no flush beyond what was acknowledged
        self.store = Store.open(self.dir)
        assert self.store.stats().recovered_tail is False
        assert self.store.check() == []

    @rule()
    def compact(self) -> None:
        before = self.store.stats()
        r = self.store.compact()
        assert r.messages == len(self.model)
        assert r.bytes_before == before.log_size
        after = self.store.stats()
        assert after.dead_bytes == 0 and after.deleted_messages == 0
        assert self.store.check() == []

    @rule()
    def drop_snapshot_and_reopen(self) -> None:
        self.store.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.dir, "snapshot.bin"))
        self.store = Store.open(self.dir)
        assert self.store.check() == []

    @invariant()
    def same_as_model(self) -> None:
        assert list(self.store.messages.items()) == list(self.model.items())
        st_ = self.store.stats()
        assert st_.dead_bytes >= 0 and st_.last_error == ""


StoreMachine.TestCase.settings = settings(max_examples=25, stateful_step_count=25, deadline=None)
test_store_against_a_dict_model = StoreMachine.TestCase


class LongStoreMachine(StoreMachine):
    """The same, many more and longer runs (slow suite)."""


LongStoreMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=60, deadline=None
)
test_store_against_a_dict_model_long = pytest.mark.slow(LongStoreMachine.TestCase)

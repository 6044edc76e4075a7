"""The readers/writer lock: readers share, writers exclude everyone, waiting writers go first."""

from __future__ import annotations

import threading

from convmem_engine.service.rwlock import RWLock


def test_readers_share_and_writers_exclude() -> None:
    lock = RWLock()
    inside = threading.Barrier(2, timeout=10)

    def reader() -> None:
        with lock.read():
            inside.wait()  # both readers are inside at once, or this times out

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    log: list[str] = []
    reader_in = threading.Event()
    release_reader = threading.Event()

    def long_reader() -> None:
        with lock.read():
            reader_in.set()
            release_reader.wait(10)
            log.append("reader done")

    def writer() -> None:
        with lock.write():
            log.append("writer")

    r = threading.Thread(target=long_reader)
    r.start()
    reader_in.wait(10)
    w = threading.Thread(target=writer)
    w.start()
    # The writer waits for the reader; a new reader now waits behind the writer.
    while lock._writers_waiting == 0:
        threading.Event().wait(0.001)

    def late_reader() -> None:
        with lock.read():
            log.append("late reader")

    late = threading.Thread(target=late_reader)
    late.start()
    release_reader.set()
    for t in (r, w, late):
        t.join(10)
    assert log == ["reader done", "writer", "late reader"]

"""Child process for the crash and lock tests (run as a script; never imported by pytest).

python storage_child.py writer DATA_DIR SEED THREADS
    writes in a loop; before each operation prints "I <op> <id> <revision>", after it is
    acknowledged (durable) prints "A <op> <id> <revision>"; occasionally compacts.
python storage_child.py hold DATA_DIR
    opens the store, prints "LOCKED" and sleeps until killed.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from convmem_engine.domain import Message
from convmem_engine.storage import Store

_out = threading.Lock()


def say(line: str) -> None:
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def content_for(mid: str, rev: int) -> str:
    return f"content of {mid} revision {rev} " + "x" * (len(mid) * rev % 300)


def writer(data_dir: str, seed: int, threads: int) -> None:
    store = Store.open(data_dir)
    say(f"READY {len(store.messages)}")
    rng = random.Random(seed)
    base = f"{os.getpid():08d}"

    def run(t: int) -> None:
        mine: list[tuple[str, int]] = []
        i = 0
        while True:
            i += 1
            r = rng.random()
            if threads == 1 and mine and r < 0.15:
                k = rng.randrange(len(mine))
                mid, rev = mine[k]
                m = store.get(mid)
                assert m is not None
                new = Message(
                    mid,
                    m.session_id,
                    m.timestamp,
                    m.role,
                    content_for(mid, rev + 1),
                    rev + 1,
                    m.updated_at + 1,
                    m.metadata,
                )
                say(f"I U {mid} {rev + 1}")
                store.update(new)
                mine[k] = (mid, rev + 1)
                say(f"A U {mid} {rev + 1}")
            elif threads == 1 and mine and r < 0.25:
                mid, rev = mine.pop(rng.randrange(len(mine)))
                say(f"I D {mid} {rev}")
                store.delete(mid)
                say(f"A D {mid} {rev}")
            elif threads == 1 and r < 0.27:
                say("I C - 0")
                store.compact()
                say("A C - 0")
            else:
                mid = f"{base}{t:02d}{i:016d}"
                m = Message(
                    mid,
                    f"s{t}",
                    1_700_000_000_000 + i,
                    "user",
                    content_for(mid, 1),
                    1,
                    1_700_000_000_000 + i,
                )
                say(f"I P {mid} 1")
                store.put(m)
                mine.append((mid, 1))
                say(f"A P {mid} 1")

    ts = [threading.Thread(target=run, args=(t,), daemon=True) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def hold(data_dir: str) -> None:
    store = Store.open(data_dir)
    say("LOCKED")
    time.sleep(600)
    store.close()


if __name__ == "__main__":
    if sys.argv[1] == "writer":
        writer(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        hold(sys.argv[2])

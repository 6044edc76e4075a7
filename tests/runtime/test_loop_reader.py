"""`loop_reader.LoopReader`: stdin read on the session's loop, on real pipes and sockets.

It reads at most `READ_AHEAD_CHUNKS` chunks ahead of the session (a host that writes faster
than the session reads blocks on a full pipe), gives back every byte once and in order, ends
with EOF for good, and leaves the descriptor in the mode it found it; `close()` ends a read in
progress with EOF. Where the loop cannot watch a descriptor (a regular file), or where another
descriptor of ours (stdout, stderr) is the same open file, `usable` says so.
"""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
import threading

from convmem_engine.runtime.loop_reader import READ_AHEAD_CHUNKS, READ_CHUNK_BYTES, LoopReader


def test_a_slow_session_keeps_the_reader_a_few_chunks_ahead_and_gets_every_byte() -> None:
    in_read, in_write = os.pipe()
    body = bytes(range(256)) * (40 * READ_CHUNK_BYTES // 256)
    writer = threading.Thread(target=lambda: (os.write(in_write, body), os.close(in_write)))

    async def session() -> bytes:
        reader = LoopReader(asyncio.get_running_loop(), in_read)
        assert not os.get_blocking(in_read)  # a read on the loop never waits
        writer.start()
        chunks = [await reader.read()]
        for _ in range(50):  # the session does something else; the reader must stop
            await asyncio.sleep(0.001)
        assert len(reader._chunks) <= READ_AHEAD_CHUNKS
        while chunk := await reader.read():
            chunks.append(chunk)
        assert await reader.read() == b""  # end of input stays end of input
        return b"".join(chunks)

    assert asyncio.run(session()) == body
    writer.join(30)
    assert os.get_blocking(in_read)  # given back as it was
    os.close(in_read)


def test_close_ends_a_waiting_read_and_gives_the_descriptor_back() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:

        async def session() -> bytes:
            reader = LoopReader(asyncio.get_running_loop(), theirs.fileno())
            waiting = asyncio.ensure_future(reader.read())
            await asyncio.sleep(0.01)
            assert not waiting.done()  # nothing sent yet
            reader.close()
            ours.sendall(b"after close\n")
            return await waiting

        assert asyncio.run(session()) == b""
        assert os.get_blocking(theirs.fileno())
        assert theirs.recv(100) == b"after close\n"  # not read by the closed reader


def test_only_pipes_and_sockets_are_read_on_the_loop() -> None:
    in_read, in_write = os.pipe()
    ours, theirs = socket.socketpair()
    with tempfile.TemporaryFile() as regular, ours, theirs:

        async def check() -> tuple[bool, bool, bool]:
            loop = asyncio.get_running_loop()
            return (
                LoopReader.usable(loop, in_read),
                LoopReader.usable(loop, theirs.fileno()),
                LoopReader.usable(loop, regular.fileno()),
            )

        assert asyncio.run(check()) == (True, True, False)

        async def shared() -> tuple[bool, bool]:
            loop = asyncio.get_running_loop()
            also_out = os.dup(theirs.fileno())  # one socket as stdin and stdout: not on the loop
            try:
                return (
                    LoopReader.usable(loop, theirs.fileno(), (also_out, in_write)),
                    LoopReader.usable(loop, theirs.fileno(), (ours.fileno(), in_write)),
                )
            finally:
                os.close(also_out)

        assert asyncio.run(shared()) == (False, True)
    for fd in (in_read, in_write):
        os.close(fd)

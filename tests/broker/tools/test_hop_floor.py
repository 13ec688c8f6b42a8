"""``mq-bench hop-floor`` (broker/tools/hop_floor.py): the frame reader, the codecs, the commit rule
and the group-commit syncer without processes; and one short real run (slow: it starts four
processes per case) whose summary is well formed and whose processes are all gone at the end."""

from __future__ import annotations

import asyncio
import json
import os
import random
from pathlib import Path

import pytest
from cryptography.exceptions import InvalidTag

from broker.tools import hop_floor
from broker.tools.mqbench import main


def test_frames_survive_any_split_and_oversized_ones_are_refused() -> None:
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    payloads = [rng.randbytes(rng.randrange(0, 3000)) for _ in range(200)]
    stream = b"".join(hop_floor.frame(p) for p in payloads)
    reader = hop_floor.FrameReader()
    got: list[bytes] = []
    pos = 0
    while pos < len(stream):
        step = rng.randrange(1, 5000)
        got += reader.feed(stream[pos : pos + step])
        pos += step
    assert got == payloads
    with pytest.raises(hop_floor.FrameError):
        hop_floor.FrameReader(max_bytes=100).feed(hop_floor.frame(b"x" * 101))


@pytest.mark.parametrize("name", hop_floor.CODECS)
def test_codecs_round_trip(name: str) -> None:
    codec = hop_floor.make_codec(name)
    reader = hop_floor.FrameReader()
    (req,) = reader.feed(codec.request(7, b"body"))
    assert codec.parse_request(req) == (7, b"body")
    (ans,) = reader.feed(codec.answer(7, 42))
    assert codec.parse_answer(ans) == (7, 42)
    bodies = [b"a" * 3, b"", b"xyz" * 100]
    payload, records = codec.append(5, bodies)
    first, count, written = codec.parse_append(payload)
    assert (first, count) == (5, 3)
    assert bytes(written) == bytes(records)  # the follower writes what the leader wrote
    assert codec.parse_ack(codec.ack(2**40)) == 2**40
    if name == "raw":
        assert bytes(records) == b"".join(len(b).to_bytes(4, "big") + b for b in bodies)
        with pytest.raises(hop_floor.FrameError):
            codec.parse_ack(b"\0" * 7)


def test_a_message_is_answered_once_the_leader_and_one_follower_have_it() -> None:
    assert hop_floor.commit_index(10, [3, 7]) == 7
    assert hop_floor.commit_index(5, [3, 7]) == 5  # the leader's own copy is not durable beyond 5
    assert hop_floor.commit_index(10, [0, 0]) == 0
    assert hop_floor.commit_index(10, []) == 0


def test_peer_frames_are_sealed_per_direction_with_sequence_nonces() -> None:
    key = hop_floor.peer_key(b"s" * 32, "follower-1", "down")
    assert key != hop_floor.peer_key(b"s" * 32, "follower-1", "up") != hop_floor.peer_key(b"s" * 32, "follower-2", "up")
    sealer, opener = hop_floor.Sealer(key), hop_floor.Sealer(key)
    frames = [sealer.seal(b"one"), sealer.seal(b"two")]
    assert [opener.open(f) for f in frames] == [b"one", b"two"]
    with pytest.raises(InvalidTag):  # the second frame replayed is not the third
        opener.open(frames[1])


@pytest.mark.parametrize("mode", hop_floor.SYNC_MODES)
async def test_the_syncer_covers_everything_written(mode: str, tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    fd = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    synced: list[int] = []
    reached = asyncio.Event()

    def on_synced(index: int) -> None:
        synced.append(index)
        if index == 3:
            reached.set()

    syncer = hop_floor.Syncer(loop, fd, mode, on_synced, lambda exc: pytest.fail(str(exc)))
    try:
        for index in (1, 2, 3):  # written in one loop turn: with the thread, at most two jobs
            os.write(fd, b"x")
            syncer.wrote(index)
        await asyncio.wait_for(reached.wait(), 10)
    finally:
        syncer.close()
        os.close(fd)
    assert synced == sorted(synced) and synced[-1] == 3 and syncer.synced == 3
    assert synced == ([1, 3] if mode == "thread" else [1, 2, 3])


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for argv in (["hop-floor", "--senders", "0"], ["hop-floor", "--senders", "1,x"],
                 ["hop-floor", "--sync", "later"], ["hop-floor", "--duration", "0"],
                 ["hop-floor", "--dir", str(tmp_path / "missing")]):  # fmt: skip
        assert main(argv) == 2, argv
    err = capsys.readouterr().err
    assert "--senders" in err and "--dir" in err


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.slow
def test_a_short_run_reports_every_process_and_ends_them(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = ["hop-floor", "--senders", "1,4", "--duration", "1", "--warmup", "0.2", "--crypto", "--codec", "msgpack",
            "--dir", str(tmp_path), "--json"]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["sync"], summary["codec"], summary["crypto"], summary["size"]) == ("thread", "msgpack", True, 1024)
    assert [c["senders"] for c in summary["cases"]] == [1, 4]
    for case in summary["cases"]:
        assert case["messages"] > 0 and case["msgs_per_s"] > 0, case
        assert case["rt_ms"]["p50"] <= case["rt_ms"]["p99"] <= case["rt_ms"]["max"]
        assert set(case["cpu"]) == {"client", "leader", "follower-1", "follower-2"}
        for name, cpu in case["cpu"].items():
            for key in ("cpu_us_per_msg", "user_us_per_msg", "system_us_per_msg", "ctx_switches_per_msg"):
                assert cpu[key] is not None, (name, key, cpu)
            assert _gone(cpu["pid"]), f"{name} (pid {cpu['pid']}) still runs"
    assert list(tmp_path.iterdir()) == []  # each case's files are removed

    assert main(["hop-floor", "--senders", "2", "--duration", "1", "--warmup", "0.2", "--sync", "inline"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("hop-floor: --sync inline, codec raw, crypto off, 1024-byte bodies"), text
    assert "2 senders: " in text and "CPU µs/msg (user + system): client " in text and "follower-2 " in text, text


class _Sent:
    """Stands in for a link or a client connection: records what the leader writes to it."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def send(self, payload: bytes) -> None:
        self.frames.append(payload)

    write = send


async def test_the_leader_replicates_a_turn_in_one_frame_and_answers_on_a_majority(tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    ending = hop_floor._Ending(loop)
    codec = hop_floor.RawCodec()
    fd = os.open(tmp_path / "leader.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    leader = hop_floor.Leader(loop, codec, fd, "inline", ending)
    links, client = [_Sent(), _Sent()], _Sent()
    leader.links, leader.acked = links, [0, 0]  # type: ignore[assignment]
    try:
        for req_id in (10, 11, 12):  # one loop turn
            leader.on_request(client, req_id, b"m%d" % req_id)  # type: ignore[arg-type]
        await asyncio.sleep(0)  # the turn ends: the batch goes
        assert [len(link.frames) for link in links] == [1, 1]
        first, count, records = codec.parse_append(links[0].frames[0])
        assert (first, count) == (1, 3) and links[0].frames == links[1].frames
        assert (tmp_path / "leader.log").read_bytes() == bytes(records)  # the leader's own copy
        assert client.frames == []  # durable on the leader alone: not yet a majority
        leader.on_ack(1, 2)
        answers = hop_floor.FrameReader().feed(b"".join(client.frames))
        assert [codec.parse_answer(a) for a in answers] == []  # the batch is answered as a whole (up to 3)
        leader.on_ack(0, 3)
        answers = hop_floor.FrameReader().feed(b"".join(client.frames))
        assert [codec.parse_answer(a) for a in answers] == [(10, 1), (11, 2), (12, 3)]
        assert len(client.frames) == 1  # one write per client connection
    finally:
        os.close(fd)
    assert not ending.future.done()

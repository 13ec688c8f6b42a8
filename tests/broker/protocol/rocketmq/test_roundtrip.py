"""Round trips of the remoting codecs over generated values (hypothesis), and the frame decoder fed
in pieces. Hypothesis prints the failing example and its seed (``--hypothesis-seed`` replays it)."""

from __future__ import annotations

import datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.protocol.rocketmq import bodies, command, fastjson, headers, message, properties
from broker.protocol.rocketmq.codes import SerializeType

int32 = st.integers(-(2**31), 2**31 - 1)
int16 = st.integers(-(2**15), 2**15 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
# text without lone surrogates (UTF-8 cannot carry them; Java writes "?")
text = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
ext_map = st.dictionaries(text.filter(lambda s: len(s.encode()) <= 255), text, max_size=8)


@st.composite
def commands(draw: st.DrawFn) -> command.RemotingCommand:
    stype = draw(st.sampled_from(list(SerializeType)))
    binary = stype == SerializeType.ROCKETMQ
    remark = draw(st.none() | text)
    ext = draw(st.none() | ext_map)
    if binary:
        # the binary header cannot tell a missing remark or map from an empty one
        remark = remark or None
        ext = ext or None
    return command.RemotingCommand(
        code=draw(int16 if binary else int32), opaque=draw(int32), flag=draw(st.integers(0, 3)),
        language=draw(st.integers(0, 12)), version=draw(int16 if binary else int32), remark=remark,
        ext_fields=ext, body=draw(st.binary(max_size=64)), serialize_type=stype,
    )


@settings(max_examples=300, deadline=None)
@given(commands())
def test_commands_round_trip(cmd: command.RemotingCommand) -> None:
    assert command.decode(command.encode(cmd)) == cmd


@settings(max_examples=100, deadline=None)
@given(st.lists(commands(), min_size=1, max_size=6), st.data())
def test_the_frame_decoder_reassembles_frames_cut_anywhere(cmds: list[command.RemotingCommand],
                                                           data: st.DataObject) -> None:
    stream = b"".join(command.encode(c) for c in cmds)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    decoder = command.FrameDecoder()
    out = []
    last = 0
    for cut in [*cuts, len(stream)]:
        decoder.feed(stream[last:cut])
        last = cut
        while (got := decoder.next()) is not None:
            out.append(got)
    assert out == cmds
    assert not decoder.mid_frame


hosts = st.one_of(
    st.builds(message.Host, st.binary(min_size=4, max_size=4), st.integers(0, 65535)),
    st.builds(message.Host, st.binary(min_size=16, max_size=16), st.integers(0, 65535)),
)
prop_text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x01\x02"), min_size=1, max_size=12)
props = st.dictionaries(prop_text, prop_text, max_size=6)


@st.composite
def stored(draw: st.DrawFn) -> message.StoredMessage:
    born, store = draw(hosts), draw(hosts)
    sys_flag = draw(st.integers(0, 0xFFFF)) & ~0x30
    sys_flag |= (0x10 if born.is_v6 else 0) | (0x20 if store.is_v6 else 0)
    return message.StoredMessage(
        topic=draw(st.text(min_size=1, max_size=200).filter(lambda t: len(t.encode("utf-8", "surrogatepass")) < 3000
                                                           and t.isprintable() and not any(
                                                               0xD800 <= ord(c) <= 0xDFFF for c in t))),
        body=draw(st.binary(max_size=100)), queue_id=draw(int32), queue_offset=draw(int64),
        commit_log_offset=draw(int64), born_timestamp=draw(int64), born_host=born, store_timestamp=draw(int64),
        store_host=store, sys_flag=sys_flag, flag=draw(int32), reconsume_times=draw(int32),
        prepared_transaction_offset=draw(int64), properties=draw(props), body_crc=draw(st.none() | int32),
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(stored(), max_size=4))
def test_stored_messages_round_trip(msgs: list[message.StoredMessage]) -> None:
    raw = message.encode_stored_many(msgs)
    back = message.decode_stored_many(raw)
    assert [m.body_crc if m.body_crc is not None else message.body_crc(m.body) for m in msgs] == [
        b.body_crc for b in back]
    assert [(m.topic, m.body, m.queue_id, m.queue_offset, m.properties, m.born_host, m.store_host, m.sys_flag)
            for m in msgs] == [(b.topic, b.body, b.queue_id, b.queue_offset, b.properties, b.born_host, b.store_host,
                                b.sys_flag) for b in back]
    assert all(message.parse_offset_msg_id(b.offset_msg_id) == (b.store_host, b.commit_log_offset) for b in back)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.builds(message.BatchItem, int32, st.binary(max_size=50), props), max_size=5))
def test_batches_round_trip(items: list[message.BatchItem]) -> None:
    assert message.decode_batch(message.encode_batch(items)) == items


@settings(max_examples=200, deadline=None)
@given(props, st.booleans())
def test_properties_round_trip(p: dict[str, str], trailing: bool) -> None:
    assert properties.decode_properties(properties.encode_properties(p, trailing_separator=trailing)) == p


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=3000), st.integers(0, 9))
def test_zlib_bodies_round_trip(body: bytes, level: int) -> None:
    flag = properties.COMPRESSED_FLAG | properties.COMPRESSION_ZLIB_TYPE
    assert message.decompress_body(message.compress_body(body, level), flag) == body
    assert message.decompress_body(message.compress_body(body, level), properties.COMPRESSED_FLAG) == body


json_values = st.recursive(
    st.none() | st.booleans() | int64 | text | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_fastjson_text_reads_back(value: object) -> None:
    def strip_nulls(v: object) -> object:  # fastjson leaves null members out
        if isinstance(v, dict):
            return {k: strip_nulls(x) for k, x in v.items() if x is not None}
        if isinstance(v, list):
            return [strip_nulls(x) for x in v]
        return v
    assert fastjson.loads(fastjson.dumps(value)) == strip_nulls(value)


@settings(max_examples=200, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_java_doubles_read_back_as_the_same_double(value: float) -> None:
    assert float(fastjson.java_double(value).replace("E", "e")) == value


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(text, text, st.integers(0, 1000), int64, int64, int64), max_size=5), st.floats(0, 1e9))
def test_queue_keyed_bodies_round_trip(rows: list[tuple[str, str, int, int, int, int]], tps: float) -> None:
    table = tuple((bodies.MessageQueue(topic=t, broker_name=b, queue_id=q),
                   bodies.OffsetWrapper(broker_offset=x, consumer_offset=y, last_timestamp=z))
                  for t, b, q, x, y, z in rows)
    stats = bodies.ConsumeStats(offset_table=table, consume_tps=tps)
    assert bodies.decode(bodies.ConsumeStats, bodies.encode(stats)) == stats


def test_header_fields_round_trip() -> None:
    h = headers.EndTransactionRequestHeader(
        producer_group="pg", tran_state_table_offset=5, commit_log_offset=2**40, commit_or_rollback=8,
        msg_id="AB", from_transaction_check=True, transaction_id="t")
    ext = headers.to_ext(h)
    assert ext["fromTransactionCheck"] == "true" and ext["commitLogOffset"] == str(2**40)
    assert headers.parse(headers.EndTransactionRequestHeader, ext) == h


def test_human_time_is_javas_shape() -> None:
    assert bodies.human_time(1700000005007, datetime.UTC) == "2023-11-14#22:13:25:007"

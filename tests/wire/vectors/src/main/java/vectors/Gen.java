package vectors;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.Unpooled;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.rocketmq.acl.common.AclClientRPCHook;
import org.apache.rocketmq.acl.common.SessionCredentials;
import org.apache.rocketmq.common.DataVersion;
import org.apache.rocketmq.common.MQVersion;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.UtilAll;
import org.apache.rocketmq.common.admin.ConsumeStats;
import org.apache.rocketmq.common.admin.OffsetWrapper;
import org.apache.rocketmq.common.admin.TopicOffset;
import org.apache.rocketmq.common.admin.TopicStatsTable;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.filter.ExpressionType;
import org.apache.rocketmq.common.filter.FilterAPI;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageAccessor;
import org.apache.rocketmq.common.message.MessageDecoder;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.common.protocol.RequestCode;
import org.apache.rocketmq.common.protocol.ResponseCode;
import org.apache.rocketmq.common.protocol.body.CheckClientRequestBody;
import org.apache.rocketmq.common.protocol.body.ClusterInfo;
import org.apache.rocketmq.common.protocol.body.Connection;
import org.apache.rocketmq.common.protocol.body.ConsumerConnection;
import org.apache.rocketmq.common.protocol.body.GroupList;
import org.apache.rocketmq.common.protocol.body.KVTable;
import org.apache.rocketmq.common.protocol.body.LockBatchRequestBody;
import org.apache.rocketmq.common.protocol.body.LockBatchResponseBody;
import org.apache.rocketmq.common.protocol.body.ProducerConnection;
import org.apache.rocketmq.common.protocol.body.QueryConsumeTimeSpanBody;
import org.apache.rocketmq.common.protocol.body.QueueTimeSpan;
import org.apache.rocketmq.common.protocol.body.ResetOffsetBody;
import org.apache.rocketmq.common.protocol.body.SubscriptionGroupWrapper;
import org.apache.rocketmq.common.protocol.body.TopicConfigSerializeWrapper;
import org.apache.rocketmq.common.protocol.body.TopicList;
import org.apache.rocketmq.common.protocol.body.UnlockBatchRequestBody;
import org.apache.rocketmq.common.protocol.header.GetConsumerListByGroupResponseBody;
import org.apache.rocketmq.common.protocol.header.PullMessageRequestHeader;
import org.apache.rocketmq.common.protocol.header.PullMessageResponseHeader;
import org.apache.rocketmq.common.protocol.header.SendMessageRequestHeader;
import org.apache.rocketmq.common.protocol.header.SendMessageRequestHeaderV2;
import org.apache.rocketmq.common.protocol.header.SendMessageResponseHeader;
import org.apache.rocketmq.common.protocol.header.UpdateConsumerOffsetRequestHeader;
import org.apache.rocketmq.common.protocol.heartbeat.ConsumeType;
import org.apache.rocketmq.common.protocol.heartbeat.ConsumerData;
import org.apache.rocketmq.common.protocol.heartbeat.HeartbeatData;
import org.apache.rocketmq.common.protocol.heartbeat.MessageModel;
import org.apache.rocketmq.common.protocol.heartbeat.ProducerData;
import org.apache.rocketmq.common.protocol.heartbeat.SubscriptionData;
import org.apache.rocketmq.common.protocol.route.BrokerData;
import org.apache.rocketmq.common.protocol.route.QueueData;
import org.apache.rocketmq.common.protocol.route.TopicRouteData;
import org.apache.rocketmq.common.subscription.SubscriptionGroupConfig;
import org.apache.rocketmq.common.sysflag.MessageSysFlag;
import org.apache.rocketmq.remoting.CommandCustomHeader;
import org.apache.rocketmq.remoting.protocol.LanguageCode;
import org.apache.rocketmq.remoting.protocol.RemotingCommand;
import org.apache.rocketmq.remoting.protocol.RemotingSerializable;
import org.apache.rocketmq.remoting.protocol.SerializeType;

/**
 * Prints test vectors made by the official RocketMQ classes as one JSON object on stdout:
 * frames as NettyEncoder writes them, stored messages, batch bodies, message ids, ACL signatures,
 * fastjson bodies and String.hashCode values. Every input is fixed, so two runs print the same.
 * Our own program: it only calls the public API of the jars it is built against.
 */
public final class Gen {
    private static final Map<String, Object> OUT = new LinkedHashMap<>();

    public static void main(String[] args) throws Exception {
        System.setProperty(RemotingCommand.REMOTING_VERSION_KEY, Integer.toString(MQVersion.CURRENT_VERSION));
        Map<String, Object> meta = new LinkedHashMap<>();
        meta.put("rocketmq_version", MQVersion.getVersionDesc(MQVersion.CURRENT_VERSION));
        meta.put("current_version", MQVersion.CURRENT_VERSION);
        meta.put("v4_9_3", MQVersion.Version.V4_9_3.ordinal());
        OUT.put("meta", meta);
        frames();
        messages();
        acl();
        bodies();
        hashes();
        escapes();
        System.out.println(json(OUT));
    }

    // -- frames -----------------------------------------------------------------------------------
    private static SendMessageRequestHeader sendHeaderV1() {
        SendMessageRequestHeader h = new SendMessageRequestHeader();
        h.setProducerGroup("pg_vectors");
        h.setTopic("TopicTest");
        h.setDefaultTopic("TBW102");
        h.setDefaultTopicQueueNums(4);
        h.setQueueId(3);
        h.setSysFlag(0);
        h.setBornTimestamp(1700000000123L);
        h.setFlag(0);
        h.setProperties("KEYS\u0001order-1\u0002UNIQ_KEY\u00017F0000010001B4AAC2B5\u0002WAIT\u0001true\u0002TAGS\u0001TagA");
        h.setReconsumeTimes(0);
        h.setUnitMode(false);
        h.setBatch(false);
        return h;
    }

    private static PullMessageRequestHeader pullHeader() {
        PullMessageRequestHeader h = new PullMessageRequestHeader();
        h.setConsumerGroup("cg_vectors");
        h.setTopic("TopicTest");
        h.setQueueId(1);
        h.setQueueOffset(42L);
        h.setMaxMsgNums(32);
        h.setSysFlag(0x1 | 0x2 | 0x4);
        h.setCommitOffset(40L);
        h.setSuspendTimeoutMillis(15000L);
        h.setSubscription("TagA || TagB");
        h.setSubVersion(1700000000999L);
        h.setExpressionType("TAG");
        return h;
    }

    /** What NettyEncoder writes for the command. */
    private static byte[] wire(RemotingCommand cmd) {
        ByteBuf buf = Unpooled.buffer();
        cmd.fastEncodeHeader(buf);
        if (cmd.getBody() != null) {
            buf.writeBytes(cmd.getBody());
        }
        byte[] out = new byte[buf.readableBytes()];
        buf.readBytes(out);
        return out;
    }

    private static Map<String, Object> frame(RemotingCommand cmd) {
        byte[] w = wire(cmd);
        byte[] whole = new byte[cmd.encode().remaining()];
        Map<String, Object> v = new LinkedHashMap<>();
        v.put("hex", hex(w));
        ByteBuffer enc = cmd.encode();
        enc.get(whole);
        v.put("encode_hex", hex(whole));
        v.put("code", cmd.getCode());
        v.put("language", cmd.getLanguage().name());
        v.put("version", cmd.getVersion());
        v.put("opaque", cmd.getOpaque());
        v.put("flag", cmd.getFlag());
        v.put("remark", cmd.getRemark());
        v.put("serialize_type", cmd.getSerializeTypeCurrentRPC().name());
        v.put("ext_fields", pairs(cmd.getExtFields()));
        v.put("body_hex", cmd.getBody() == null ? null : hex(cmd.getBody()));
        return v;
    }

    private static void frames() throws Exception {
        Map<String, Object> frames = new LinkedHashMap<>();
        for (SerializeType type : SerializeType.values()) {
            String t = type.name().toLowerCase();

            RemotingCommand send = RemotingCommand.createRequestCommand(RequestCode.SEND_MESSAGE_V2,
                SendMessageRequestHeaderV2.createSendMessageRequestHeaderV2(sendHeaderV1()));
            send.setOpaque(7);
            send.setBody("hello".getBytes(StandardCharsets.UTF_8));
            send.setSerializeTypeCurrentRPC(type);
            frames.put("send_v2_" + t, frame(send));

            RemotingCommand sendV1 = RemotingCommand.createRequestCommand(RequestCode.SEND_MESSAGE, sendHeaderV1());
            sendV1.setOpaque(8);
            sendV1.setBody(new byte[] {0, 1, 2, (byte) 0xff});
            sendV1.setSerializeTypeCurrentRPC(type);
            frames.put("send_v1_" + t, frame(sendV1));

            RemotingCommand signed = RemotingCommand.createRequestCommand(RequestCode.SEND_MESSAGE_V2,
                SendMessageRequestHeaderV2.createSendMessageRequestHeaderV2(sendHeaderV1()));
            signed.setOpaque(9);
            signed.setBody("hello".getBytes(StandardCharsets.UTF_8));
            signed.setSerializeTypeCurrentRPC(type);
            new AclClientRPCHook(new SessionCredentials("RocketMQ", "12345678")).doBeforeRequest("127.0.0.1:10911", signed);
            frames.put("send_v2_signed_" + t, frame(signed));

            RemotingCommand pull = RemotingCommand.createRequestCommand(RequestCode.PULL_MESSAGE, pullHeader());
            pull.setOpaque(10);
            pull.setSerializeTypeCurrentRPC(type);
            frames.put("pull_" + t, frame(pull));

            RemotingCommand sendResp = RemotingCommand.createResponseCommand(SendMessageResponseHeader.class);
            SendMessageResponseHeader srh = (SendMessageResponseHeader) sendResp.readCustomHeader();
            srh.setMsgId("7F00000100002A9F0000000000001F40");
            srh.setQueueId(3);
            srh.setQueueOffset(1234567890123L);
            srh.setTransactionId(null);
            sendResp.setCode(ResponseCode.SUCCESS);
            sendResp.setRemark(null);
            sendResp.setOpaque(7);
            sendResp.addExtField("MSG_REGION", "DefaultRegion");
            sendResp.addExtField("TRACE_ON", "true");
            sendResp.setSerializeTypeCurrentRPC(type);
            frames.put("send_response_" + t, frame(sendResp));

            RemotingCommand pullResp = RemotingCommand.createResponseCommand(PullMessageResponseHeader.class);
            PullMessageResponseHeader prh = (PullMessageResponseHeader) pullResp.readCustomHeader();
            prh.setSuggestWhichBrokerId(0L);
            prh.setNextBeginOffset(74L);
            prh.setMinOffset(0L);
            prh.setMaxOffset(100L);
            pullResp.setCode(ResponseCode.SUCCESS);
            pullResp.setRemark("FOUND");
            pullResp.setOpaque(10);
            pullResp.setBody(new byte[] {1, 2, 3});
            pullResp.setSerializeTypeCurrentRPC(type);
            frames.put("pull_response_" + t, frame(pullResp));

            RemotingCommand notSupported = RemotingCommand.createResponseCommand(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED, " request type 9999 not supported");
            notSupported.setOpaque(11);
            notSupported.setSerializeTypeCurrentRPC(type);
            frames.put("not_supported_" + t, frame(notSupported));

            RemotingCommand odd = RemotingCommand.createResponseCommand(ResponseCode.SYSTEM_ERROR,
                "quote\" backslash\\ slash/ nl\n tab\t cr\r bs\b ff\f ctl\u0001\u001f del\u007f "
                    + "u2028\u2028 \u4e2d\u6587 emoji\ud83d\ude00 lone\ud800 <>&'");
            odd.setOpaque(-2);
            odd.addExtField("k\"ey", "v\\al\n\u4e2d");
            odd.addExtField("empty", "");
            odd.setSerializeTypeCurrentRPC(type);
            frames.put("odd_strings_" + t, frame(odd));

            UpdateConsumerOffsetRequestHeader uh = new UpdateConsumerOffsetRequestHeader();
            uh.setConsumerGroup("cg_vectors");
            uh.setTopic("TopicTest");
            uh.setQueueId(0);
            uh.setCommitOffset(77L);
            RemotingCommand oneway = RemotingCommand.createRequestCommand(RequestCode.UPDATE_CONSUMER_OFFSET, uh);
            oneway.markOnewayRPC();
            oneway.setOpaque(Integer.MAX_VALUE);
            oneway.setSerializeTypeCurrentRPC(type);
            frames.put("oneway_" + t, frame(oneway));

            RemotingCommand bare = RemotingCommand.createRequestCommand(RequestCode.GET_BROKER_CLUSTER_INFO, null);
            bare.setOpaque(Integer.MIN_VALUE);
            bare.setSerializeTypeCurrentRPC(type);
            bare.setLanguage(LanguageCode.GO);
            frames.put("bare_" + t, frame(bare));
        }
        OUT.put("frames", frames);
    }

    // -- messages ---------------------------------------------------------------------------------
    private static MessageExt messageExt(boolean v6, boolean withProps) throws Exception {
        MessageExt m = new MessageExt();
        m.setTopic("TopicTest");
        byte[] body = "Hello RocketMQ \u4e2d\u6587".getBytes(StandardCharsets.UTF_8);
        m.setBody(body);
        m.setBodyCRC(UtilAll.crc32(body));
        m.setQueueId(2);
        m.setFlag(0);
        m.setQueueOffset(100L);
        m.setCommitLogOffset(1234567L);
        int sysFlag = 0;
        if (v6) {
            sysFlag |= MessageSysFlag.BORNHOST_V6_FLAG | MessageSysFlag.STOREHOSTADDRESS_V6_FLAG;
            m.setBornHost(new InetSocketAddress(InetAddress.getByName("fe80::1:2"), 51234));
            m.setStoreHost(new InetSocketAddress(InetAddress.getByName("2001:db8::10"), 10911));
        } else {
            m.setBornHost(new InetSocketAddress(InetAddress.getByName("10.0.0.7"), 51234));
            m.setStoreHost(new InetSocketAddress(InetAddress.getByName("127.0.0.1"), 10911));
        }
        m.setSysFlag(sysFlag);
        m.setBornTimestamp(1700000000123L);
        m.setStoreTimestamp(1700000000456L);
        m.setReconsumeTimes(0);
        m.setPreparedTransactionOffset(0L);
        if (withProps) {
            m.setTags("TagA");
            m.setKeys("order-1 order-2");
            m.putUserProperty("color", "\u7ea2");
            MessageAccessor.putProperty(m, "UNIQ_KEY", "7F0000010001B4AAC2B50000000A");
        }
        return m;
    }

    private static Map<String, Object> stored(MessageExt m, boolean compress) throws Exception {
        Map<String, Object> v = new LinkedHashMap<>();
        byte[] raw = MessageDecoder.encode(m, compress);
        v.put("hex", hex(raw));
        v.put("topic", m.getTopic());
        v.put("body_hex", hex(m.getBody()));
        v.put("body_crc", m.getBodyCRC());
        v.put("queue_id", m.getQueueId());
        v.put("flag", m.getFlag());
        v.put("queue_offset", m.getQueueOffset());
        v.put("commit_log_offset", m.getCommitLogOffset());
        v.put("sys_flag", m.getSysFlag());
        v.put("born_timestamp", m.getBornTimestamp());
        v.put("born_host", hex(bytesOf(m.getBornHostBytes())));
        v.put("store_timestamp", m.getStoreTimestamp());
        v.put("store_host", hex(bytesOf(m.getStoreHostBytes())));
        v.put("reconsume_times", m.getReconsumeTimes());
        v.put("prepared_transaction_offset", m.getPreparedTransactionOffset());
        v.put("properties", pairs(m.getProperties()));
        MessageExt back = MessageDecoder.decode(ByteBuffer.wrap(raw), true, true, true);
        v.put("msg_id", back.getMsgId());
        v.put("offset_msg_id", ((org.apache.rocketmq.common.message.MessageClientExt) back).getOffsetMsgId());
        v.put("decoded_body_hex", hex(back.getBody()));
        return v;
    }

    private static void messages() throws Exception {
        Map<String, Object> msgs = new LinkedHashMap<>();
        msgs.put("stored_v4_props", stored(messageExt(false, true), false));
        msgs.put("stored_v4_no_props", stored(messageExt(false, false), false));
        msgs.put("stored_v6_props", stored(messageExt(true, true), false));
        MessageExt txn = messageExt(false, true);
        txn.setSysFlag(MessageSysFlag.TRANSACTION_PREPARED_TYPE | MessageSysFlag.MULTI_TAGS_FLAG);
        MessageAccessor.putProperty(txn, "TRAN_MSG", "true");
        MessageAccessor.putProperty(txn, "PGROUP", "pg_vectors");
        txn.setReconsumeTimes(3);
        txn.setPreparedTransactionOffset(99L);
        txn.setFlag(5);
        msgs.put("stored_v4_txn", stored(txn, false));
        MessageExt zipped = messageExt(false, true);
        byte[] big = new byte[5000];
        for (int i = 0; i < big.length; i++) {
            big[i] = (byte) ('a' + i % 7);
        }
        zipped.setBody(big);
        zipped.setBodyCRC(UtilAll.crc32(big));
        zipped.setSysFlag(MessageSysFlag.COMPRESSED_FLAG | MessageSysFlag.COMPRESSION_ZLIB_TYPE);
        msgs.put("stored_v4_zlib", stored(zipped, true));

        List<Message> batch = new ArrayList<>();
        for (int i = 0; i < 3; i++) {
            Message m = new Message("TopicTest", "Tag" + i, "key-" + i, ("batch body " + i).getBytes(StandardCharsets.UTF_8));
            m.setFlag(i);
            MessageAccessor.putProperty(m, "UNIQ_KEY", "7F0000010001B4AAC2B5000" + i);
            m.setWaitStoreMsgOK(true);
            batch.add(m);
        }
        batch.add(new Message("TopicTest", new byte[0]));
        Map<String, Object> b = new LinkedHashMap<>();
        b.put("hex", hex(MessageDecoder.encodeMessages(batch)));
        List<Object> items = new ArrayList<>();
        for (Message m : batch) {
            Map<String, Object> it = new LinkedHashMap<>();
            it.put("flag", m.getFlag());
            it.put("body_hex", hex(m.getBody()));
            it.put("properties", pairs(m.getProperties()));
            it.put("properties_string", MessageDecoder.messageProperties2String(m.getProperties()));
            items.add(it);
        }
        b.put("messages", items);
        msgs.put("batch", b);

        Map<String, Object> ids = new LinkedHashMap<>();
        ByteBuffer v4 = ByteBuffer.allocate(8);
        v4.put(InetAddress.getByName("192.168.1.20").getAddress());
        v4.putInt(10911);
        v4.flip();
        ids.put("v4", MessageDecoder.createMessageId(ByteBuffer.allocate(16), v4, 0x0102030405060708L));
        ByteBuffer v6 = ByteBuffer.allocate(20);
        v6.put(InetAddress.getByName("2001:db8::10").getAddress());
        v6.putInt(10911);
        v6.flip();
        ids.put("v6", MessageDecoder.createMessageId(ByteBuffer.allocate(28), v6, 987654321L));
        ids.put("v4_socket", MessageDecoder.createMessageId(new InetSocketAddress("127.0.0.1", 10911), 8000L));
        msgs.put("msg_ids", ids);
        OUT.put("messages", msgs);
    }

    // -- ACL --------------------------------------------------------------------------------------
    private static Map<String, Object> signed(RemotingCommand cmd, String ak, String sk, String token) {
        if (token == null) {
            new AclClientRPCHook(new SessionCredentials(ak, sk)).doBeforeRequest("127.0.0.1:10911", cmd);
        } else {
            new AclClientRPCHook(new SessionCredentials(ak, sk, token)).doBeforeRequest("127.0.0.1:10911", cmd);
        }
        Map<String, Object> v = new LinkedHashMap<>();
        v.put("access_key", ak);
        v.put("secret_key", sk);
        v.put("security_token", token);
        v.put("ext_fields", pairs(cmd.getExtFields()));
        v.put("body_hex", cmd.getBody() == null ? null : hex(cmd.getBody()));
        v.put("signature", cmd.getExtFields().get("Signature"));
        return v;
    }

    private static void acl() throws Exception {
        Map<String, Object> acl = new LinkedHashMap<>();
        RemotingCommand send = RemotingCommand.createRequestCommand(RequestCode.SEND_MESSAGE_V2,
            SendMessageRequestHeaderV2.createSendMessageRequestHeaderV2(sendHeaderV1()));
        send.setBody("hello".getBytes(StandardCharsets.UTF_8));
        acl.put("send_v2", signed(send, "RocketMQ", "12345678", null));
        RemotingCommand pull = RemotingCommand.createRequestCommand(RequestCode.PULL_MESSAGE, pullHeader());
        acl.put("pull_token", signed(pull, "rocketmq2", "12345678abc", "token-\u4e2d"));
        RemotingCommand bare = RemotingCommand.createRequestCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, null);
        bare.addExtField("topic", "TopicTest");
        acl.put("route", signed(bare, "ak", "sk", null));
        RemotingCommand binary = RemotingCommand.createRequestCommand(RequestCode.SEND_BATCH_MESSAGE, null);
        binary.addExtField("b", "TopicTest");
        binary.addExtField("_UNIQUE_KEY_QUERY", "false");
        binary.setBody(new byte[] {(byte) 0xff, 0, (byte) 0x80, 0x7f});
        acl.put("binary_body", signed(binary, "RocketMQ", "12345678", null));
        OUT.put("acl", acl);
    }

    // -- bodies -----------------------------------------------------------------------------------
    private static MessageQueue mq(int id) {
        return new MessageQueue("TopicTest", "RaftNode00", id);
    }

    private static SubscriptionData sub(String topic, String expr) throws Exception {
        SubscriptionData s = FilterAPI.buildSubscriptionData(topic, expr);
        s.setSubVersion(1700000000999L);
        return s;
    }

    private static void bodies() throws Exception {
        Map<String, Object> b = new LinkedHashMap<>();

        TopicRouteData route = new TopicRouteData();
        QueueData qd = new QueueData();
        qd.setBrokerName("RaftNode00");
        qd.setReadQueueNums(8);
        qd.setWriteQueueNums(8);
        qd.setPerm(6);
        qd.setTopicSysFlag(0);
        route.setQueueDatas(new ArrayList<>(Arrays.asList(qd)));
        HashMap<Long, String> addrs = new HashMap<>();
        addrs.put(0L, "127.0.0.1:10911");
        addrs.put(1L, "127.0.0.1:10921");
        addrs.put(2L, "127.0.0.1:10931");
        BrokerData bd = new BrokerData("DefaultCluster", "RaftNode00", addrs);
        route.setBrokerDatas(new ArrayList<>(Arrays.asList(bd)));
        route.setFilterServerTable(new HashMap<>());
        b.put("topic_route", route.toJson());
        TopicRouteData ordered = new TopicRouteData();
        ordered.setOrderTopicConf("RaftNode00:8");
        ordered.setQueueDatas(new ArrayList<>());
        ordered.setBrokerDatas(new ArrayList<>());
        b.put("topic_route_order", ordered.toJson());

        ClusterInfo ci = new ClusterInfo();
        HashMap<String, BrokerData> bat = new HashMap<>();
        bat.put("RaftNode00", bd);
        HashMap<Long, String> addrs1 = new HashMap<>();
        addrs1.put(0L, "127.0.0.1:11911");
        bat.put("RaftNode01", new BrokerData("DefaultCluster", "RaftNode01", addrs1));
        ci.setBrokerAddrTable(bat);
        HashMap<String, java.util.Set<String>> cat = new HashMap<>();
        cat.put("DefaultCluster", new HashSet<>(Arrays.asList("RaftNode00", "RaftNode01")));
        ci.setClusterAddrTable(cat);
        b.put("cluster_info", ci.toJson());

        HeartbeatData hb = new HeartbeatData();
        hb.setClientID("127.0.0.1@12345#1700000000000");
        ProducerData pd = new ProducerData();
        pd.setGroupName("pg_vectors");
        hb.getProducerDataSet().add(pd);
        ConsumerData cd = new ConsumerData();
        cd.setGroupName("cg_vectors");
        cd.setConsumeType(ConsumeType.CONSUME_PASSIVELY);
        cd.setMessageModel(MessageModel.CLUSTERING);
        cd.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET);
        cd.getSubscriptionDataSet().add(sub("TopicTest", "TagA || TagB"));
        cd.getSubscriptionDataSet().add(sub("%RETRY%cg_vectors", "*"));
        SubscriptionData sql = FilterAPI.build("TopicSql", "a > 5 AND color = 'red'", ExpressionType.SQL92);
        sql.setSubVersion(1700000000998L);
        cd.getSubscriptionDataSet().add(sql);
        cd.setUnitMode(false);
        hb.getConsumerDataSet().add(cd);
        b.put("heartbeat", hb.toJson());

        LockBatchRequestBody lock = new LockBatchRequestBody();
        lock.setConsumerGroup("cg_vectors");
        lock.setClientId("127.0.0.1@12345");
        lock.getMqSet().add(mq(0));
        lock.getMqSet().add(mq(1));
        b.put("lock_batch_request", lock.toJson());
        LockBatchResponseBody lockResp = new LockBatchResponseBody();
        lockResp.getLockOKMQSet().add(mq(1));
        b.put("lock_batch_response", lockResp.toJson());
        UnlockBatchRequestBody unlock = new UnlockBatchRequestBody();
        unlock.setConsumerGroup("cg_vectors");
        unlock.setClientId("127.0.0.1@12345");
        unlock.getMqSet().add(mq(2));
        b.put("unlock_batch_request", unlock.toJson());

        ConsumerConnection cc = new ConsumerConnection();
        Connection conn = new Connection();
        conn.setClientId("127.0.0.1@12345");
        conn.setClientAddr("127.0.0.1:50000");
        conn.setLanguage(LanguageCode.JAVA);
        conn.setVersion(MQVersion.CURRENT_VERSION);
        cc.getConnectionSet().add(conn);
        cc.getSubscriptionTable().put("TopicTest", sub("TopicTest", "TagA"));
        cc.setConsumeType(ConsumeType.CONSUME_PASSIVELY);
        cc.setMessageModel(MessageModel.BROADCASTING);
        cc.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        b.put("consumer_connection", cc.toJson());
        ProducerConnection pc = new ProducerConnection();
        pc.getConnectionSet().add(conn);
        b.put("producer_connection", pc.toJson());

        ConsumeStats cs = new ConsumeStats();
        for (int i = 0; i < 3; i++) {
            OffsetWrapper ow = new OffsetWrapper();
            ow.setBrokerOffset(100 + i);
            ow.setConsumerOffset(90 + i);
            ow.setLastTimestamp(1700000000000L + i);
            cs.getOffsetTable().put(mq(i), ow);
        }
        cs.setConsumeTps(12.5);
        b.put("consume_stats", cs.toJson());
        ConsumeStats empty = new ConsumeStats();
        b.put("consume_stats_empty", empty.toJson());
        ConsumeStats bigTps = new ConsumeStats();
        bigTps.setConsumeTps(12345678.25);
        b.put("consume_stats_big_tps", bigTps.toJson());

        TopicStatsTable ts = new TopicStatsTable();
        for (int i = 0; i < 2; i++) {
            TopicOffset to = new TopicOffset();
            to.setMinOffset(i);
            to.setMaxOffset(1000 + i);
            to.setLastUpdateTimestamp(1700000000000L + i);
            ts.getOffsetTable().put(mq(i), to);
        }
        b.put("topic_stats", ts.toJson());

        KVTable kv = new KVTable();
        kv.getTable().put("brokerVersionDesc", "V4_9_8");
        kv.getTable().put("msgPutTotalTodayNow", "12");
        kv.getTable().put("quote\"d", "line\nbreak");
        b.put("kv_table", kv.toJson());

        TopicList tl = new TopicList();
        tl.getTopicList().add("TopicTest");
        tl.getTopicList().add("%RETRY%cg_vectors");
        tl.getTopicList().add("TBW102");
        b.put("topic_list", tl.toJson());
        TopicList tl2 = new TopicList();
        tl2.setBrokerAddr("127.0.0.1:10911");
        b.put("topic_list_addr", tl2.toJson());

        GroupList gl = new GroupList();
        gl.getGroupList().add("cg_vectors");
        gl.getGroupList().add("other");
        b.put("group_list", gl.toJson());

        SubscriptionGroupConfig sgc = new SubscriptionGroupConfig();
        sgc.setGroupName("cg_vectors");
        sgc.setRetryMaxTimes(3);
        b.put("subscription_group_config", RemotingSerializable.toJson(sgc, false));

        TopicConfig tc = new TopicConfig("TopicTest", 8, 8, 6);
        b.put("topic_config", RemotingSerializable.toJson(tc, false));

        TopicConfigSerializeWrapper tcw = new TopicConfigSerializeWrapper();
        ConcurrentHashMap<String, TopicConfig> tct = new ConcurrentHashMap<>();
        tct.put("TopicTest", tc);
        TopicConfig tc2 = new TopicConfig("TopicOrder", 4, 4, 6);
        tc2.setOrder(true);
        tct.put("TopicOrder", tc2);
        tcw.setTopicConfigTable(tct);
        DataVersion dv = new DataVersion();
        dv.setTimestamp(1700000000000L);
        dv.setCounter(new java.util.concurrent.atomic.AtomicLong(5));
        tcw.setDataVersion(dv);
        b.put("topic_config_wrapper", tcw.toJson());

        SubscriptionGroupWrapper sgw = new SubscriptionGroupWrapper();
        sgw.getSubscriptionGroupTable().put("cg_vectors", sgc);
        sgw.setDataVersion(dv);
        b.put("subscription_group_wrapper", sgw.toJson());

        QueryConsumeTimeSpanBody span = new QueryConsumeTimeSpanBody();
        QueueTimeSpan qts = new QueueTimeSpan();
        qts.setMessageQueue(mq(0));
        qts.setMinTimeStamp(1700000000000L);
        qts.setMaxTimeStamp(1700000009000L);
        qts.setConsumeTimeStamp(1700000005000L);
        qts.setDelayTime(4000L);
        span.getConsumeTimeSpanSet().add(qts);
        b.put("consume_time_span", span.toJson());

        ResetOffsetBody reset = new ResetOffsetBody();
        HashMap<MessageQueue, Long> rt = new HashMap<>();
        rt.put(mq(0), 5L);
        rt.put(mq(1), 6L);
        reset.setOffsetTable(rt);
        b.put("reset_offset", reset.toJson());

        GetConsumerListByGroupResponseBody gcl = new GetConsumerListByGroupResponseBody();
        gcl.setConsumerIdList(new ArrayList<>(Arrays.asList("127.0.0.1@1", "127.0.0.1@2")));
        b.put("consumer_list", gcl.toJson());

        CheckClientRequestBody ccr = new CheckClientRequestBody();
        ccr.setClientId("127.0.0.1@12345");
        ccr.setGroup("cg_vectors");
        ccr.setSubscriptionData(sql);
        b.put("check_client", ccr.toJson());

        OUT.put("bodies", b);
    }

    private static void hashes() {
        Map<String, Object> h = new LinkedHashMap<>();
        for (String s : new String[] {"", "TagA", "TagB", "*", "a-very-long-tag-name-with-many-characters-0123456789",
            "\u4e2d\u6587\u6807\u7b7e", "emoji\ud83d\ude00", "\u00e9t\u00e9", "polygenelubricants"}) {
            h.put(s, s.hashCode());
        }
        OUT.put("string_hash", h);
    }

    /** Every BMP character that fastjson does not write as itself inside a JSON string. */
    private static void escapes() {
        List<Object> out = new ArrayList<>();
        for (int c = 0; c <= 0xFFFF; c++) {
            if (c >= 0xD800 && c <= 0xDFFF) {
                continue;
            }
            String s = String.valueOf((char) c);
            String j = com.alibaba.fastjson.JSON.toJSONString(s);
            if (!j.equals("\"" + s + "\"")) {
                out.add(Arrays.asList(c, j));
            }
        }
        OUT.put("fastjson_escapes", out);
    }

    // -- output -----------------------------------------------------------------------------------
    private static List<Object> pairs(Map<String, String> m) {
        List<Object> out = new ArrayList<>();
        if (m != null) {
            for (Map.Entry<String, String> e : m.entrySet()) {
                out.add(Arrays.asList(e.getKey(), e.getValue()));
            }
        }
        return out;
    }

    private static byte[] bytesOf(ByteBuffer buf) {
        byte[] out = new byte[buf.remaining()];
        buf.get(out);
        return out;
    }

    private static String hex(byte[] b) {
        StringBuilder sb = new StringBuilder();
        for (byte x : b) {
            sb.append(String.format("%02x", x & 0xff));
        }
        return sb.toString();
    }

    private static String json(Object o) {
        StringBuilder sb = new StringBuilder();
        write(sb, o, 0);
        return sb.toString();
    }

    private static void write(StringBuilder sb, Object o, int depth) {
        if (o == null) {
            sb.append("null");
        } else if (o instanceof String) {
            String s = (String) o;
            sb.append('"');
            for (int i = 0; i < s.length(); i++) {
                char c = s.charAt(i);
                if (c == '"' || c == '\\') {
                    sb.append('\\').append(c);
                } else if (c < 0x20 || c > 0x7e) {
                    sb.append(String.format("\\u%04x", (int) c));
                } else {
                    sb.append(c);
                }
            }
            sb.append('"');
        } else if (o instanceof Number || o instanceof Boolean) {
            sb.append(o.toString());
        } else if (o instanceof Map) {
            sb.append("{\n");
            boolean first = true;
            for (Map.Entry<?, ?> e : ((Map<?, ?>) o).entrySet()) {
                if (!first) {
                    sb.append(",\n");
                }
                first = false;
                indent(sb, depth + 1);
                write(sb, e.getKey().toString(), depth + 1);
                sb.append(": ");
                write(sb, e.getValue(), depth + 1);
            }
            sb.append('\n');
            indent(sb, depth);
            sb.append('}');
        } else if (o instanceof List) {
            sb.append('[');
            boolean first = true;
            for (Object x : (List<?>) o) {
                if (!first) {
                    sb.append(", ");
                }
                first = false;
                write(sb, x, depth + 1);
            }
            sb.append(']');
        } else {
            throw new IllegalArgumentException("cannot write " + o.getClass());
        }
    }

    private static void indent(StringBuilder sb, int depth) {
        for (int i = 0; i < depth; i++) {
            sb.append("  ");
        }
    }
}

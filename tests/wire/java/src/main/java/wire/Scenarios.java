package wire;

import java.io.ByteArrayOutputStream;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.BooleanSupplier;

import org.apache.rocketmq.acl.common.AclClientRPCHook;
import org.apache.rocketmq.acl.common.SessionCredentials;
import org.apache.rocketmq.client.ClientConfig;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.MessageSelector;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.client.consumer.rebalance.AllocateMessageQueueAveragely;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.MessageQueueSelector;
import org.apache.rocketmq.client.producer.SendCallback;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.producer.TransactionSendResult;
import org.apache.rocketmq.client.QueryResult;
import org.apache.rocketmq.common.MQVersion;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageAccessor;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.RPCHook;

/**
 * The wire tier's scenarios with the official RocketMQ remoting client (built against 4.9.8 and 5.3.1 from
 * this one source). Prints exactly one JSON line on stdout: {"scenario", "client", "ok", ...results} and exits
 * 0, or {"ok": false, "reason": ...} and exits 1 (2 for bad arguments). Diagnostics go to stderr.
 *
 * <pre>
 *   wire.Scenarios SCENARIO --namesrv HOST:PORT --topic T --group G
 *       [--ak AK --sk SK]            ACL on: every client carries AclClientRPCHook(AK, SK)
 *       [--tls] [--tls-ca FILE]      TLS to NameServer and brokers (without --tls-ca: the client's test mode, any cert)
 *       [--vip true|false]           sendMessageWithVIPChannel (client default false in 4.9.8 and 5.3.1)
 *       [--kill-cmd CMD]             run once mid-scenario (orderly, bulk): kills the group's leader
 *       [--restart-cmd CMD]          run after the first successful send following the kill (restarts it)
 *       [--count N] [--timeout S] [--poll-ms MS] [--send-timeout-ms MS]
 * </pre>
 *
 * Scenarios: send, push-tags, lite-pull, orderly, delay, retry-dlq, txn, sql92, query, progress, bulk, and hold
 * (a live producer and consumer for the mqadmin tests: a "ready" line first, then the result at stdin's EOF).
 * Topic and group names must be fresh per run (the driver makes them unique); a scenario that needs several
 * groups derives them from --group with a suffix. The topic must exist (the driver creates it).
 */
public final class Scenarios {
    static final class Failure extends RuntimeException {
        Failure(String reason) {
            super(reason);
        }
    }

    // ---------------------------------------------------------------------------------------- options
    String scenario, namesrv, topic, group, ak, sk, killCmd, restartCmd, tlsCa;
    boolean tls, vip;
    int count = -1;
    long timeoutMs = 120_000, pollMs = -1, sendTimeoutMs = 3_000;

    final Map<String, Object> out = new LinkedHashMap<>();
    final List<Runnable> closers = new ArrayList<>();
    final AtomicInteger instanceSeq = new AtomicInteger();
    long startNs, deadlineNs;

    static String need(String[] a, int i) {
        if (i >= a.length) {
            throw new IllegalArgumentException("missing value for " + a[i - 1]);
        }
        return a[i];
    }

    void parse(String[] a) {
        if (a.length < 1) {
            throw new IllegalArgumentException("usage: wire.Scenarios SCENARIO --namesrv ADDR --topic T --group G ...");
        }
        scenario = a[0];
        for (int i = 1; i < a.length; i++) {
            switch (a[i]) {
                case "--namesrv" -> namesrv = need(a, ++i);
                case "--topic" -> topic = need(a, ++i);
                case "--group" -> group = need(a, ++i);
                case "--ak" -> ak = need(a, ++i);
                case "--sk" -> sk = need(a, ++i);
                case "--tls" -> tls = true;
                case "--tls-ca" -> tlsCa = need(a, ++i);
                case "--vip" -> vip = Boolean.parseBoolean(need(a, ++i));
                case "--kill-cmd" -> killCmd = need(a, ++i);
                case "--restart-cmd" -> restartCmd = need(a, ++i);
                case "--count" -> count = Integer.parseInt(need(a, ++i));
                case "--timeout" -> timeoutMs = Long.parseLong(need(a, ++i)) * 1000;
                case "--poll-ms" -> pollMs = Long.parseLong(need(a, ++i));
                case "--send-timeout-ms" -> sendTimeoutMs = Long.parseLong(need(a, ++i));
                default -> throw new IllegalArgumentException("unknown option " + a[i]);
            }
        }
        if (namesrv == null || topic == null || group == null) {
            throw new IllegalArgumentException("--namesrv, --topic and --group are required");
        }
        if ((ak == null) != (sk == null)) {
            throw new IllegalArgumentException("--ak and --sk go together");
        }
    }

    int count(int dflt) {
        return count > 0 ? count : dflt;
    }

    // ---------------------------------------------------------------------------------------- helpers
    static long nowMs() {
        return System.currentTimeMillis();
    }

    long elapsedMs() {
        return (System.nanoTime() - startNs) / 1_000_000;
    }

    final Map<String, Long> phases = new LinkedHashMap<>();

    /** Records how long the scenario had run when it reached a phase (in the result's "phases"). */
    void mark(String phase) {
        phases.put(phase, elapsedMs());
        out.put("phases", phases);
    }

    static void log(String fmt, Object... args) {
        System.err.printf("[wire %tT] %s%n", System.currentTimeMillis(), String.format(fmt, args));
    }

    static void check(boolean cond, String reason) {
        if (!cond) {
            throw new Failure(reason);
        }
    }

    /** Waits for cond (polled every 20 ms) until the scenario's deadline or maxMs, whichever is first. */
    void await(String what, long maxMs, BooleanSupplier cond) {
        long end = Math.min(deadlineNs, System.nanoTime() + maxMs * 1_000_000);
        while (!cond.getAsBoolean()) {
            if (System.nanoTime() > end) {
                throw new Failure("timed out waiting for " + what);
            }
            try {
                Thread.sleep(20);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new Failure("interrupted waiting for " + what);
            }
        }
        mark(what);
    }

    void await(String what, BooleanSupplier cond) {
        await(what, Long.MAX_VALUE / 2_000_000, cond);
    }

    RPCHook hook() {
        return ak == null ? null : new AclClientRPCHook(new SessionCredentials(ak, sk));
    }

    void configure(ClientConfig c) {
        c.setNamesrvAddr(namesrv);
        c.setInstanceName("wire-" + ProcessHandle.current().pid() + "-" + instanceSeq.incrementAndGet());
        c.setVipChannelEnabled(vip);
        if (tls) {
            c.setUseTLS(true);
        }
        if (pollMs > 0) {
            c.setPollNameServerInterval((int) pollMs);
        }
    }

    DefaultMQProducer producer(String g) throws Exception {
        DefaultMQProducer p = new DefaultMQProducer(g, hook());
        configure(p);
        p.setSendMsgTimeout((int) sendTimeoutMs);
        p.start();
        closers.add(p::shutdown);
        return p;
    }

    DefaultMQPushConsumer push(String g, boolean broadcasting) {
        DefaultMQPushConsumer c = new DefaultMQPushConsumer(g, hook(), new AllocateMessageQueueAveragely());
        configure(c);
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        if (broadcasting) {
            broadcasting(c);
        }
        closers.add(c::shutdown);
        return c;
    }

    /** setMessageModel(BROADCASTING): the enum moved from common.protocol (4.x) to remoting.protocol (5.x). */
    @SuppressWarnings({"unchecked", "rawtypes"})
    static void broadcasting(DefaultMQPushConsumer c) {
        for (String cls : List.of("org.apache.rocketmq.remoting.protocol.heartbeat.MessageModel",
            "org.apache.rocketmq.common.protocol.heartbeat.MessageModel")) {
            try {
                Class e = Class.forName(cls);
                c.getClass().getMethod("setMessageModel", e).invoke(c, Enum.valueOf(e, "BROADCASTING"));
                return;
            } catch (ReflectiveOperationException ignored) {
                // the other version's name
            }
        }
        throw new Failure("no MessageModel enum found");
    }

    DefaultLitePullConsumer lite(String g) {
        DefaultLitePullConsumer c = new DefaultLitePullConsumer(g, hook());
        configure(c);
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.setPollTimeoutMillis(500);
        closers.add(c::shutdown);
        return c;
    }

    /** One delivery as a consumer saw it. */
    record Got(String id, String offsetMsgId, String topic, String body, String tags, String keys, int queueId,
               long queueOffset, int reconsumeTimes, long bornTs, long storeTs, long recvMs, String consumer,
               Map<String, String> props) {
        static Got of(MessageExt m, String consumer) {
            return new Got(m.getMsgId(), offsetIdOf(m), m.getTopic(), new String(m.getBody(), StandardCharsets.UTF_8),
                m.getTags(), m.getKeys(), m.getQueueId(), m.getQueueOffset(), m.getReconsumeTimes(),
                m.getBornTimestamp(), m.getStoreTimestamp(), nowMs(), consumer, new HashMap<>(m.getProperties()));
        }
    }

    static String offsetIdOf(MessageExt m) {
        try {
            return (String) m.getClass().getMethod("getOffsetMsgId").invoke(m);
        } catch (ReflectiveOperationException e) {
            return null;
        }
    }

    /** Every delivery to a set of consumers, by message id (UNIQ_KEY) and in arrival order. */
    static final class Sink {
        final ConcurrentLinkedQueue<Got> all = new ConcurrentLinkedQueue<>();
        final ConcurrentHashMap<String, List<Got>> byId = new ConcurrentHashMap<>();
        final ConcurrentHashMap<String, List<Got>> byBody = new ConcurrentHashMap<>();

        void add(Got g) {
            all.add(g);
            byId.computeIfAbsent(g.id(), k -> Collections.synchronizedList(new ArrayList<>())).add(g);
            byBody.computeIfAbsent(g.body(), k -> Collections.synchronizedList(new ArrayList<>())).add(g);
        }

        void addAll(Collection<MessageExt> ms, String consumer) {
            for (MessageExt m : ms) {
                add(Got.of(m, consumer));
            }
        }

        boolean hasAllIds(Collection<String> ids) {
            for (String id : ids) {
                if (!byId.containsKey(id)) {
                    return false;
                }
            }
            return true;
        }

        boolean hasAllBodies(Collection<String> bodies) {
            for (String b : bodies) {
                if (!byBody.containsKey(b)) {
                    return false;
                }
            }
            return true;
        }

        List<String> missingIds(Collection<String> ids) {
            List<String> miss = new ArrayList<>();
            for (String id : ids) {
                if (!byId.containsKey(id)) {
                    miss.add(id);
                }
            }
            return miss;
        }

        int duplicates() {
            int d = 0;
            for (List<Got> l : byId.values()) {
                d += l.size() - 1;
            }
            return d;
        }
    }

    MessageListenerConcurrently into(Sink s, String name) {
        return (msgs, ctx) -> {
            s.addAll(msgs, name);
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        };
    }

    static Message msg(String topic, String tags, String keys, String body) {
        Message m = new Message(topic, tags, keys, body.getBytes(StandardCharsets.UTF_8));
        return m;
    }

    static void sendOk(SendResult r, String what) {
        check(r != null && r.getSendStatus() == SendStatus.SEND_OK,
            what + ": send status " + (r == null ? "null" : r.getSendStatus()));
    }

    /** Latencies in ms: p50/p99/max of the samples (ns). */
    static Map<String, Object> lat(List<Long> ns) {
        Map<String, Object> m = new LinkedHashMap<>();
        if (ns.isEmpty()) {
            return m;
        }
        List<Long> s = new ArrayList<>(ns);
        Collections.sort(s);
        m.put("n", s.size());
        m.put("p50_ms", s.get(s.size() / 2) / 1e6);
        m.put("p99_ms", s.get(Math.min(s.size() - 1, (int) Math.ceil(s.size() * 0.99) - 1)) / 1e6);
        m.put("max_ms", s.get(s.size() - 1) / 1e6);
        return m;
    }

    static List<String> head(Collection<String> c, int n) {
        List<String> l = new ArrayList<>();
        for (String s : c) {
            if (l.size() == n) {
                break;
            }
            l.add(s);
        }
        return l;
    }

    /** Runs a shell command to completion (bounded by the deadline); returns its stdout. */
    String shell(String what, String cmd) {
        try {
            Process p = new ProcessBuilder("bash", "-c", cmd).redirectError(ProcessBuilder.Redirect.INHERIT).start();
            InputStream in = p.getInputStream();
            ByteArrayOutputStream buf = new ByteArrayOutputStream();
            Thread reader = new Thread(() -> {
                try {
                    in.transferTo(buf);
                } catch (java.io.IOException ignored) {
                    // the process ended
                }
            });
            reader.start();
            long left = Math.max(1, (deadlineNs - System.nanoTime()) / 1_000_000);
            if (!p.waitFor(left, TimeUnit.MILLISECONDS)) {
                p.destroyForcibly();
                throw new Failure(what + " command did not finish: " + cmd);
            }
            reader.join(5_000);
            String o = buf.toString(StandardCharsets.UTF_8).trim();
            check(p.exitValue() == 0, what + " command failed (exit " + p.exitValue() + "): " + cmd + ": " + o);
            log("%s: %s -> %s", what, cmd, o);
            return o;
        } catch (java.io.IOException e) {
            throw new Failure(what + " command could not start: " + e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new Failure("interrupted");
        }
    }

    /** The kill/restart choreography shared by orderly and bulk. */
    final class Killer {
        final AtomicLong killedAtMs = new AtomicLong();
        final AtomicLong firstOkAfterKillMs = new AtomicLong();
        final AtomicReference<Thread> restarter = new AtomicReference<>();
        final AtomicReference<String> restartError = new AtomicReference<>();
        volatile boolean killed;

        synchronized void kill() {
            if (killed || killCmd == null) {
                return;
            }
            killed = true;
            String o = shell("kill", killCmd);
            killedAtMs.set(nowMs());
            out.put("kill_output", o);
        }

        void sendOk() {
            if (!killed || killedAtMs.get() == 0 || firstOkAfterKillMs.get() != 0) {
                return;
            }
            if (firstOkAfterKillMs.compareAndSet(0, nowMs()) && restartCmd != null) {
                Thread t = new Thread(() -> {
                    try {
                        shell("restart", restartCmd);
                    } catch (Failure f) {
                        restartError.set(f.getMessage());
                    }
                });
                t.setDaemon(true);
                t.start();
                restarter.set(t);
            }
        }

        void finish() throws InterruptedException {
            if (killCmd != null) {
                check(killed, "the kill command never ran");
                out.put("kill_to_first_send_ok_ms", firstOkAfterKillMs.get() == 0 ? null
                    : firstOkAfterKillMs.get() - killedAtMs.get());
            }
            Thread t = restarter.get();
            if (t != null) {
                t.join(Math.max(1, (deadlineNs - System.nanoTime()) / 1_000_000));
                check(!t.isAlive(), "the restart command did not finish in time");
                check(restartError.get() == null, String.valueOf(restartError.get()));
                out.put("restarted", true);
            }
        }
    }

    // ---------------------------------------------------------------------------------------- scenarios

    /** sync, async, oneway and batch sends; everything read back by a lite pull consumer. */
    void send() throws Exception {
        int n = count(40);
        DefaultMQProducer p = producer(group + "_p");
        Map<String, String> acked = new ConcurrentHashMap<>();          // id -> body
        Map<String, SendResult> results = new ConcurrentHashMap<>();    // id -> result (sync, async)
        List<Long> syncLat = new ArrayList<>();
        List<Long> asyncLat = Collections.synchronizedList(new ArrayList<>());
        for (int i = 0; i < n; i++) {
            String body = "sync-" + i;
            Message m = msg(topic, "TagA", "k-sync-" + i, body);
            m.putUserProperty("seq", Integer.toString(i));
            long t0 = System.nanoTime();
            SendResult r = p.send(m);
            syncLat.add(System.nanoTime() - t0);
            sendOk(r, body);
            check(r.getMsgId() != null && r.getOffsetMsgId() != null, body + ": no msgId/offsetMsgId");
            acked.put(r.getMsgId(), body);
            results.put(r.getMsgId(), r);
        }
        CountDownLatch done = new CountDownLatch(n);
        List<String> asyncErrors = Collections.synchronizedList(new ArrayList<>());
        for (int i = 0; i < n; i++) {
            String body = "async-" + i;
            Message m = msg(topic, "TagB", "k-async-" + i, body);
            long t0 = System.nanoTime();
            p.send(m, new SendCallback() {
                @Override
                public void onSuccess(SendResult r) {
                    asyncLat.add(System.nanoTime() - t0);
                    if (r.getSendStatus() == SendStatus.SEND_OK) {
                        acked.put(r.getMsgId(), body);
                        results.put(r.getMsgId(), r);
                    } else {
                        asyncErrors.add(body + ": " + r.getSendStatus());
                    }
                    done.countDown();
                }

                @Override
                public void onException(Throwable e) {
                    asyncErrors.add(body + ": " + e);
                    done.countDown();
                }
            });
        }
        await("async send callbacks", () -> done.getCount() == 0);
        check(asyncErrors.isEmpty(), "async sends failed: " + head(asyncErrors, 5));
        List<String> oneway = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            String body = "oneway-" + i;
            p.sendOneway(msg(topic, "TagC", "k-oneway-" + i, body));
            oneway.add(body);
        }
        int batches = 0;
        List<String> batchIds = new ArrayList<>();
        for (int i = 0; i < n; i += 10) {
            List<Message> batch = new ArrayList<>();
            for (int j = i; j < Math.min(n, i + 10); j++) {
                batch.add(msg(topic, "TagD", "k-batch-" + j, "batch-" + j));
            }
            SendResult r = p.send(batch);
            sendOk(r, "batch at " + i);
            String[] ids = r.getMsgId().split(",");
            check(ids.length == batch.size(), "batch of " + batch.size() + " returned " + ids.length + " ids: " + r.getMsgId());
            for (int j = 0; j < ids.length; j++) {
                acked.put(ids[j], "batch-" + (i + j));
                batchIds.add(ids[j]);
            }
            batches++;
        }
        Map<String, Object> sent = new LinkedHashMap<>();
        sent.put("sync", n);
        sent.put("async", n);
        sent.put("oneway", n);
        sent.put("batch", n);
        sent.put("batches", batches);
        out.put("sent", sent);
        out.put("acked", acked.size());
        out.put("sync_latency", lat(syncLat));
        out.put("async_latency", lat(asyncLat));

        Sink sink = new Sink();
        DefaultLitePullConsumer c = lite(group + "_c");
        c.subscribe(topic, "*");
        c.start();
        await("every acked id and every oneway body read back", () -> {
            sink.addAll(c.poll(), "lite");
            return sink.hasAllIds(acked.keySet()) && sink.hasAllBodies(oneway);
        });
        // What was sent is what was read: body, tags, keys, user property, queue and offset of each send.
        for (Map.Entry<String, String> e : acked.entrySet()) {
            Got g = sink.byId.get(e.getKey()).get(0);
            check(g.body().equals(e.getValue()), "id " + e.getKey() + ": body " + g.body() + " != " + e.getValue());
            String kind = e.getValue().substring(0, e.getValue().indexOf('-'));
            String wantTag = Map.of("sync", "TagA", "async", "TagB", "batch", "TagD").get(kind);
            check(wantTag.equals(g.tags()), "id " + e.getKey() + ": tags " + g.tags() + " != " + wantTag);
            check(("k-" + e.getValue()).equals(g.keys()), "id " + e.getKey() + ": keys " + g.keys());
            if (kind.equals("sync")) {
                check(e.getValue().substring(5).equals(g.props().get("seq")), "id " + e.getKey() + ": user property seq lost");
            }
            SendResult r = results.get(e.getKey());
            if (r != null) {
                check(r.getMessageQueue().getQueueId() == g.queueId() && r.getQueueOffset() == g.queueOffset(),
                    "id " + e.getKey() + ": sent to queue " + r.getMessageQueue().getQueueId() + " offset " + r.getQueueOffset()
                        + " but read at queue " + g.queueId() + " offset " + g.queueOffset());
                check(r.getOffsetMsgId().equals(g.offsetMsgId()), "id " + e.getKey() + ": offsetMsgId " + r.getOffsetMsgId()
                    + " sent, " + g.offsetMsgId() + " read");
            }
        }
        // Batch members are stored at consecutive offsets of one queue, in order.
        for (int i = 1; i < batchIds.size(); i++) {
            if (i % 10 == 0) {
                continue;
            }
            Got a = sink.byId.get(batchIds.get(i - 1)).get(0), b = sink.byId.get(batchIds.get(i)).get(0);
            check(a.queueId() == b.queueId() && a.queueOffset() + 1 == b.queueOffset(),
                "batch members " + (i - 1) + "," + i + " not consecutive: " + a.queueId() + "@" + a.queueOffset() + " "
                    + b.queueId() + "@" + b.queueOffset());
        }
        out.put("read", sink.all.size());
        out.put("duplicates", sink.duplicates());
    }

    /** Push consumers with tags: clustering (2 members, TagA || TagB) and broadcasting (2 members, TagA). */
    void pushTags() throws Exception {
        int n = count(30);
        Sink clu = new Sink();
        List<Sink> bro = List.of(new Sink(), new Sink());
        for (int i = 0; i < 2; i++) {
            DefaultMQPushConsumer c = push(group + "_clu", false);
            c.subscribe(topic, "TagA || TagB");
            c.registerMessageListener(into(clu, "clu" + i));
            c.start();
        }
        for (int i = 0; i < 2; i++) {
            DefaultMQPushConsumer c = push(group + "_bro", true);
            c.subscribe(topic, "TagA");
            c.registerMessageListener(into(bro.get(i), "bro" + i));
            c.start();
        }
        DefaultMQProducer p = producer(group + "_p");
        Map<String, List<String>> ids = new TreeMap<>();
        for (int i = 0; i < n; i++) {
            for (String tag : List.of("TagA", "TagB", "TagC")) {
                SendResult r = p.send(msg(topic, tag, null, tag + "-" + i));
                sendOk(r, tag + "-" + i);
                ids.computeIfAbsent(tag, k -> new ArrayList<>()).add(r.getMsgId());
            }
        }
        // A TagA fence in every queue, after every TagC: once a consumer has each fence, it has passed every
        // TagC of that queue (delivered or filtered).
        List<MessageQueue> mqs = p.fetchPublishMessageQueues(topic);
        List<String> fences = new ArrayList<>();
        for (MessageQueue mq : mqs) {
            SendResult r = p.send(msg(topic, "TagA", null, "fence-" + mq.getQueueId()), mq);
            sendOk(r, "fence");
            fences.add(r.getMsgId());
        }
        List<String> wantClu = new ArrayList<>(ids.get("TagA"));
        wantClu.addAll(ids.get("TagB"));
        wantClu.addAll(fences);
        List<String> wantBro = new ArrayList<>(ids.get("TagA"));
        wantBro.addAll(fences);
        await("clustering group got TagA and TagB", () -> clu.hasAllIds(wantClu));
        for (int i = 0; i < 2; i++) {
            Sink s = bro.get(i);
            await("broadcasting member " + i + " got every TagA", () -> s.hasAllIds(wantBro));
        }
        for (String c : ids.get("TagC")) {
            check(!clu.byId.containsKey(c), "clustering group (TagA || TagB) received TagC " + c);
            for (Sink s : bro) {
                check(!s.byId.containsKey(c), "broadcasting group (TagA) received TagC " + c);
            }
        }
        for (String b : ids.get("TagB")) {
            for (Sink s : bro) {
                check(!s.byId.containsKey(b), "broadcasting group (TagA) received TagB " + b);
            }
        }
        Map<String, Integer> perMember = new TreeMap<>();
        for (Got g : clu.all) {
            perMember.merge(g.consumer(), 1, Integer::sum);
        }
        out.put("queues", mqs.size());
        out.put("sent", new TreeMap<>(Map.of("TagA", n, "TagB", n, "TagC", n, "fences", fences.size())));
        out.put("clustering_received", clu.byId.size());
        out.put("clustering_per_member", perMember);
        out.put("clustering_duplicates", clu.duplicates());
        out.put("broadcasting_received", List.of(bro.get(0).byId.size(), bro.get(1).byId.size()));
    }

    /** Lite pull: subscribe with a tag (auto commit), then assign + seek from offset 0. */
    void litePull() throws Exception {
        int n = count(40);
        DefaultMQProducer p = producer(group + "_p");
        List<String> tagA = new ArrayList<>(), all = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            String tag = i % 2 == 0 ? "TagA" : "TagB";
            SendResult r = p.send(msg(topic, tag, null, tag + "-" + i));
            sendOk(r, "lite " + i);
            all.add(r.getMsgId());
            if (tag.equals("TagA")) {
                tagA.add(r.getMsgId());
            }
        }
        Sink sub = new Sink();
        DefaultLitePullConsumer c = lite(group + "_sub");
        c.subscribe(topic, "TagA");
        c.start();
        await("subscribed lite pull got every TagA", () -> {
            sub.addAll(c.poll(), "sub");
            return sub.hasAllIds(tagA);
        });
        for (Got g : sub.all) {
            check("TagA".equals(g.tags()), "TagA subscription received " + g.tags() + " " + g.id());
        }
        Sink asg = new Sink();
        DefaultLitePullConsumer a = lite(group + "_asg");
        a.setAutoCommit(false);
        a.start();
        Collection<MessageQueue> mqs = a.fetchMessageQueues(topic);
        a.assign(mqs);
        for (MessageQueue mq : mqs) {
            a.seek(mq, 0);
        }
        await("assigned lite pull got every message", () -> {
            asg.addAll(a.poll(), "asg");
            return asg.hasAllIds(all);
        });
        // Per queue, each new offset arrives after every smaller one (a repeat right after seek is a redelivery,
        // counted, not a reordering).
        Map<Integer, Long> last = new HashMap<>();
        Set<String> seenAt = new HashSet<>();
        int repeats = 0;
        for (Got g : asg.all) {
            if (!seenAt.add(g.queueId() + "@" + g.queueOffset())) {
                repeats++;
                continue;
            }
            Long prev = last.put(g.queueId(), g.queueOffset());
            check(prev == null || g.queueOffset() > prev, "queue " + g.queueId() + ": new offset " + g.queueOffset() + " after "
                + prev);
        }
        out.put("assigned_repeats", repeats);
        out.put("sent", n);
        out.put("subscribed_received", sub.byId.size());
        out.put("assigned_received", asg.byId.size());
        out.put("queues", mqs.size());
    }

    /** Ordered messages: a selector by order key, an orderly listener, the leader killed half-way. */
    void orderly() throws Exception {
        int n = count(400), keys = 8;
        Sink sink = new Sink();
        DefaultMQPushConsumer c = push(group + "_c", false);
        c.subscribe(topic, "*");
        c.registerMessageListener((MessageListenerOrderly) (msgs, ctx) -> {
            sink.addAll(msgs, "orderly");
            return ConsumeOrderlyStatus.SUCCESS;
        });
        c.start();
        DefaultMQProducer p = producer(group + "_p");
        MessageQueueSelector byKey = (mqs, m, arg) -> mqs.get((Integer) arg % mqs.size());
        Killer killer = new Killer();
        Map<Integer, List<Integer>> ackedSeq = new TreeMap<>();
        Map<String, Integer> ackedQueue = new HashMap<>();
        Set<String> ackedIds = new HashSet<>();
        int failures = 0;
        for (int i = 0; i < n; i++) {
            if (i == n / 2) {
                killer.kill();
            }
            int key = i % keys, seq = i / keys;
            Message m = msg(topic, "Ord", "ord-" + key, key + ":" + seq);
            while (true) {   // the same message object (same UNIQ_KEY) until it is acknowledged
                check(System.nanoTime() < deadlineNs, "could not send " + key + ":" + seq + " before the deadline");
                try {
                    SendResult r = p.send(m, byKey, key);
                    if (r.getSendStatus() == SendStatus.SEND_OK) {
                        ackedSeq.computeIfAbsent(key, k -> new ArrayList<>()).add(seq);
                        ackedQueue.put(r.getMsgId(), r.getMessageQueue().getQueueId());
                        ackedIds.add(r.getMsgId());
                        killer.sendOk();
                        break;
                    }
                    failures++;
                } catch (Exception e) {
                    failures++;
                    log("ordered send %d:%d failed: %s", key, seq, e);
                }
                Thread.sleep(100);   // back-off between retries of a failed send
            }
        }
        await("orderly consumer got every acked message", () -> sink.hasAllIds(ackedIds));
        killer.finish();
        // Per key: every acknowledged seq, in send order, is a subsequence of what the listener saw (re-deliveries
        // after the failover may repeat a tail, never reorder or skip); all of one key's messages in one queue.
        Map<Integer, List<Integer>> seen = new TreeMap<>();
        Map<Integer, Set<Integer>> queuesOfKey = new TreeMap<>();
        int backwards = 0;
        Map<Integer, Long> lastOffset = new HashMap<>();
        for (Got g : sink.all) {
            String[] kv = g.body().split(":");
            int key = Integer.parseInt(kv[0]);
            seen.computeIfAbsent(key, k -> new ArrayList<>()).add(Integer.parseInt(kv[1]));
            queuesOfKey.computeIfAbsent(key, k -> new HashSet<>()).add(g.queueId());
            Long prev = lastOffset.put(g.queueId(), g.queueOffset());
            if (prev != null && g.queueOffset() <= prev) {
                backwards++;
            }
        }
        for (Map.Entry<Integer, List<Integer>> e : ackedSeq.entrySet()) {
            List<Integer> got = seen.getOrDefault(e.getKey(), List.of());
            int j = 0;
            for (int s : got) {
                if (j < e.getValue().size() && e.getValue().get(j) == s) {
                    j++;
                }
            }
            check(j == e.getValue().size(), "key " + e.getKey() + ": acked order " + e.getValue() + " is not a subsequence of consumed "
                + got);
            check(queuesOfKey.get(e.getKey()).size() == 1, "key " + e.getKey() + " consumed from queues " + queuesOfKey.get(e.getKey()));
        }
        for (String id : ackedIds) {
            check(sink.byId.get(id).get(0).queueId() == ackedQueue.get(id), "id " + id + " acked in one queue, read from another");
        }
        out.put("sent_acked", ackedIds.size());
        out.put("send_failures", failures);
        out.put("consumed", sink.all.size());
        out.put("duplicates", sink.duplicates());
        out.put("redelivered_offsets", backwards);
        out.put("keys", keys);
    }

    /** Delay levels 1 (1 s) and 2 (5 s), and a 5.x timer (TIMER_DELIVER_MS = now + 3 s). */
    void delay() throws Exception {
        int n = count(4);
        Sink sink = new Sink();
        DefaultMQPushConsumer c = push(group + "_c", false);
        c.subscribe(topic, "*");
        c.registerMessageListener(into(sink, "delay"));
        c.start();
        DefaultMQProducer p = producer(group + "_p");
        Map<String, Long> notBefore = new HashMap<>();
        Map<String, String> kind = new HashMap<>();
        for (int i = 0; i < n; i++) {
            for (int level : new int[]{1, 2}) {
                Message m = msg(topic, "L" + level, null, "level" + level + "-" + i);
                m.setDelayTimeLevel(level);
                long t0 = nowMs();
                SendResult r = p.send(m);
                sendOk(r, "delay level " + level);
                notBefore.put(r.getMsgId(), t0 + (level == 1 ? 1_000 : 5_000));
                kind.put(r.getMsgId(), "level" + level);
            }
            Message m = msg(topic, "Timer", null, "timer-" + i);
            long deliverAt = nowMs() + 3_000;
            MessageAccessor.putProperty(m, "TIMER_DELIVER_MS", Long.toString(deliverAt));
            SendResult r = p.send(m);
            sendOk(r, "timer");
            // The broker's timer wheel has a precision (timerPrecisionMs, 1 s by default): not before that slot.
            notBefore.put(r.getMsgId(), deliverAt - 1_000);
            kind.put(r.getMsgId(), "timer");
        }
        await("every delayed and timed message", () -> sink.hasAllIds(notBefore.keySet()));
        Map<String, List<Long>> early = new TreeMap<>();
        for (Map.Entry<String, Long> e : notBefore.entrySet()) {
            Got g = sink.byId.get(e.getKey()).get(0);
            long margin = g.recvMs() - e.getValue();
            early.computeIfAbsent(kind.get(e.getKey()), k -> new ArrayList<>()).add(margin);
            check(margin >= 0, kind.get(e.getKey()) + " message " + e.getKey() + " delivered " + (-margin) + " ms too early");
        }
        Map<String, Object> after = new TreeMap<>();
        for (Map.Entry<String, List<Long>> e : early.entrySet()) {
            after.put(e.getKey() + "_ms_after_due_min", Collections.min(e.getValue()));
            after.put(e.getKey() + "_ms_after_due_max", Collections.max(e.getValue()));
        }
        out.put("sent", notBefore.size());
        out.put("received", sink.byId.size());
        out.put("due", after);
    }

    /** A listener that always fails: %RETRY% redeliveries (delay level 1 each) then %DLQ% after maxReconsumeTimes. */
    void retryDlq() throws Exception {
        int n = count(5), maxReconsume = 2;
        Sink sink = new Sink();
        String g = group + "_c";
        DefaultMQPushConsumer c = push(g, false);
        c.setMaxReconsumeTimes(maxReconsume);
        c.subscribe(topic, "*");
        c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            sink.addAll(msgs, "failing");
            ctx.setDelayLevelWhenNextConsume(1);
            return ConsumeConcurrentlyStatus.RECONSUME_LATER;
        });
        c.start();
        DefaultMQProducer p = producer(group + "_p");
        List<String> ids = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            SendResult r = p.send(msg(topic, "Fail", "fail-" + i, "fail-" + i));
            sendOk(r, "fail-" + i);
            ids.add(r.getMsgId());
        }
        await("every message delivered " + (maxReconsume + 1) + " times (reconsumeTimes 0.." + maxReconsume + ")", () -> {
            for (String id : ids) {
                List<Got> l = sink.byId.get(id);
                if (l == null) {
                    return false;
                }
                Set<Integer> times = new HashSet<>();
                synchronized (l) {
                    for (Got x : l) {
                        times.add(x.reconsumeTimes());
                    }
                }
                for (int t = 0; t <= maxReconsume; t++) {
                    if (!times.contains(t)) {
                        return false;
                    }
                }
            }
            return true;
        });
        // Redeliveries come from %RETRY%<group> (the client restores the original topic, and keeps the retry topic
        // in the RETRY_TOPIC property).
        int retries = 0;
        for (Got x : sink.all) {
            if (x.reconsumeTimes() > 0) {
                retries++;
                check(topic.equals(x.topic()), "redelivery topic " + x.topic());
                // The broker moved it to %RETRY%<group> and kept the original topic in RETRY_TOPIC; the client
                // restores the original topic.
                check(topic.equals(x.props().get("RETRY_TOPIC")), "redelivery RETRY_TOPIC " + x.props().get("RETRY_TOPIC"));
            }
        }
        Sink dlq = new Sink();
        DefaultLitePullConsumer d = lite(group + "_dlq");
        d.setAutoCommit(false);
        d.start();
        String dlqTopic = "%DLQ%" + g;
        await("the %DLQ% topic's route", () -> {
            try {
                return !d.fetchMessageQueues(dlqTopic).isEmpty();
            } catch (Exception e) {
                return false;
            }
        });
        Collection<MessageQueue> mqs = d.fetchMessageQueues(dlqTopic);
        d.assign(mqs);
        for (MessageQueue mq : mqs) {
            d.seek(mq, 0);
        }
        await("every message in " + dlqTopic, () -> {
            dlq.addAll(d.poll(), "dlq");
            return dlq.hasAllIds(ids);
        });
        for (String id : ids) {
            Got x = dlq.byId.get(id).get(0);
            check(x.body().startsWith("fail-"), "DLQ body " + x.body());
            check(x.reconsumeTimes() >= maxReconsume, "DLQ copy of " + id + " has reconsumeTimes " + x.reconsumeTimes());
        }
        Map<String, Integer> deliveries = new TreeMap<>();
        for (String id : ids) {
            deliveries.put(id, sink.byId.get(id).size());
        }
        out.put("sent", n);
        out.put("max_reconsume_times", maxReconsume);
        out.put("deliveries", deliveries);
        out.put("redeliveries", retries);
        out.put("dlq_topic", dlqTopic);
        out.put("dlq_queues", mqs.size());
        out.put("dlq_received", dlq.byId.size());
    }

    /** Transactions: commit, rollback, and two resolved only through the broker's check-back. */
    void txn() throws Exception {
        int n = count(3);
        Map<String, Integer> checks = new ConcurrentHashMap<>();   // key -> check-backs
        Map<String, String> checkTxnIds = new ConcurrentHashMap<>();
        TransactionMQProducer p = new TransactionMQProducer(group + "_p", hook());
        configure(p);
        p.setTransactionListener(new TransactionListener() {
            @Override
            public LocalTransactionState executeLocalTransaction(Message m, Object arg) {
                String k = m.getKeys();
                if (k.startsWith("commit-")) {
                    return LocalTransactionState.COMMIT_MESSAGE;
                }
                if (k.startsWith("rollback-")) {
                    return LocalTransactionState.ROLLBACK_MESSAGE;
                }
                return LocalTransactionState.UNKNOW;
            }

            @Override
            public LocalTransactionState checkLocalTransaction(MessageExt m) {
                String k = m.getKeys();
                checks.merge(k, 1, Integer::sum);
                checkTxnIds.put(k, String.valueOf(m.getTransactionId()));
                if (k.startsWith("check-commit-")) {
                    return LocalTransactionState.COMMIT_MESSAGE;
                }
                if (k.startsWith("check-rollback-")) {
                    return LocalTransactionState.ROLLBACK_MESSAGE;
                }
                return LocalTransactionState.UNKNOW;
            }
        });
        p.start();
        closers.add(p::shutdown);
        Sink sink = new Sink();
        DefaultMQPushConsumer c = push(group + "_c", false);
        c.subscribe(topic, "*");
        c.registerMessageListener(into(sink, "txn"));
        c.start();
        Map<String, String> idOfKey = new TreeMap<>();
        Map<String, String> stateOfKey = new TreeMap<>();
        for (int i = 0; i < n; i++) {
            for (String kind : List.of("commit", "rollback", "check-commit", "check-rollback")) {
                String key = kind + "-" + i;
                TransactionSendResult r = p.sendMessageInTransaction(msg(topic, "Txn", key, key), null);
                sendOk(r, "half message " + key);
                idOfKey.put(key, r.getMsgId());
                stateOfKey.put(key, String.valueOf(r.getLocalTransactionState()));
            }
        }
        List<String> want = new ArrayList<>(), never = new ArrayList<>();
        for (Map.Entry<String, String> e : idOfKey.entrySet()) {
            (e.getKey().contains("commit-") ? want : never).add(e.getValue());
        }
        await("committed and checked-back-committed messages", () -> sink.hasAllIds(want));
        await("a check-back for every check-rollback message", () -> {
            for (String k : idOfKey.keySet()) {
                if (k.startsWith("check-") && !checks.containsKey(k)) {
                    return false;
                }
            }
            return true;
        });
        // A fence per queue sent after the check-rollbacks were answered: once the consumer has every fence, a
        // rolled-back message that were ever to be delivered would have been.
        DefaultMQProducer fp = producer(group + "_fence");
        List<String> fences = new ArrayList<>();
        for (MessageQueue mq : fp.fetchPublishMessageQueues(topic)) {
            SendResult r = fp.send(msg(topic, "Fence", null, "fence"), mq);
            sendOk(r, "fence");
            fences.add(r.getMsgId());
        }
        await("fences", () -> sink.hasAllIds(fences));
        for (String id : never) {
            check(!sink.byId.containsKey(id), "a rolled-back message was delivered: " + id);
        }
        for (String k : idOfKey.keySet()) {
            if (!k.startsWith("check-")) {
                check(!checks.containsKey(k), "a check-back for the already resolved " + k);
            }
        }
        out.put("sent", idOfKey.size());
        out.put("local_states", stateOfKey);
        out.put("check_backs", new TreeMap<>(checks));
        out.put("check_transaction_ids", new TreeMap<>(checkTxnIds));
        out.put("delivered", sink.byId.size() - fences.size());
    }

    /** SQL92 property filters: two groups with different expressions; exactly the matching messages arrive. */
    void sql92() throws Exception {
        int n = count(40);
        String e1 = "a BETWEEN 3 AND 7 AND color = 'red'";
        String e2 = "color IN ('blue', 'green') OR a IS NULL";
        Sink s1 = new Sink(), s2 = new Sink();
        DefaultMQPushConsumer c1 = push(group + "_sql1", false);
        c1.subscribe(topic, MessageSelector.bySql(e1));
        c1.registerMessageListener(into(s1, "sql1"));
        c1.start();
        DefaultMQPushConsumer c2 = push(group + "_sql2", false);
        c2.subscribe(topic, MessageSelector.bySql(e2));
        c2.registerMessageListener(into(s2, "sql2"));
        c2.start();
        DefaultMQProducer p = producer(group + "_p");
        String[] colors = {"red", "blue", "green", "red", "yellow"};
        Set<String> want1 = new HashSet<>(), want2 = new HashSet<>(), allIds = new HashSet<>();
        for (int i = 0; i < n; i++) {
            Message m = msg(topic, "Sql", null, "sql-" + i);
            String color = colors[i % colors.length];
            boolean hasA = i % 7 != 6;
            int a = i % 10;
            m.putUserProperty("color", color);
            if (hasA) {
                m.putUserProperty("a", Integer.toString(a));
            }
            SendResult r = p.send(m);
            sendOk(r, "sql-" + i);
            allIds.add(r.getMsgId());
            if (hasA && a >= 3 && a <= 7 && color.equals("red")) {
                want1.add(r.getMsgId());
            }
            if (color.equals("blue") || color.equals("green") || !hasA) {
                want2.add(r.getMsgId());
            }
        }
        // Per queue one fence for each expression (and matching only that one).
        Set<String> fences1 = new HashSet<>(), fences2 = new HashSet<>();
        for (MessageQueue mq : p.fetchPublishMessageQueues(topic)) {
            Message f1 = msg(topic, "Fence", null, "fence1-" + mq.getQueueId());
            f1.putUserProperty("a", "5");
            f1.putUserProperty("color", "red");
            SendResult r1 = p.send(f1, mq);
            sendOk(r1, "fence1");
            fences1.add(r1.getMsgId());
            Message f2 = msg(topic, "Fence", null, "fence2-" + mq.getQueueId());
            f2.putUserProperty("color", "green");
            f2.putUserProperty("a", "9");
            SendResult r2 = p.send(f2, mq);
            sendOk(r2, "fence2");
            fences2.add(r2.getMsgId());
        }
        want1.addAll(fences1);
        want2.addAll(fences2);
        await("group 1 (" + e1 + ")", () -> s1.hasAllIds(want1));
        await("group 2 (" + e2 + ")", () -> s2.hasAllIds(want2));
        Set<String> extra1 = new HashSet<>(s1.byId.keySet()), extra2 = new HashSet<>(s2.byId.keySet());
        extra1.removeAll(want1);
        extra2.removeAll(want2);
        check(extra1.isEmpty(), "group 1 received non-matching messages: " + head(extra1, 5));
        check(extra2.isEmpty(), "group 2 received non-matching messages: " + head(extra2, 5));
        out.put("sent", n);
        out.put("expression1", e1);
        out.put("matched1", want1.size() - fences1.size());
        out.put("expression2", e2);
        out.put("matched2", want2.size() - fences2.size());
    }

    /** Query by offsetMsgId (VIEW_MESSAGE_BY_ID), by key (QUERY_MESSAGE), by unique key; queue offsets by time. */
    void query() throws Exception {
        int n = count(10);
        DefaultMQProducer p = producer(group + "_p");
        String run = Long.toString(nowMs(), 36);
        long begin = nowMs() - 60_000;
        List<SendResult> rs = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            SendResult r = p.send(msg(topic, "Q", "qk-" + run + "-" + i + " qk-" + run + "-all", "query-" + i));
            sendOk(r, "query-" + i);
            rs.add(r);
        }
        for (int i = 0; i < n; i++) {
            SendResult r = rs.get(i);
            MessageExt m = p.viewMessage(topic, r.getOffsetMsgId());
            check(m != null && ("query-" + i).equals(new String(m.getBody(), StandardCharsets.UTF_8)),
                "viewMessage(" + r.getOffsetMsgId() + ") returned " + (m == null ? null : new String(m.getBody(), StandardCharsets.UTF_8)));
            check(r.getMsgId().equals(m.getMsgId()), "viewMessage: msgId " + m.getMsgId() + " != " + r.getMsgId());
            check(m.getQueueId() == r.getMessageQueue().getQueueId() && m.getQueueOffset() == r.getQueueOffset(),
                "viewMessage: queue/offset differ from the send result");
        }
        int pick = Math.min(3, n - 1);
        String oneKey = "qk-" + run + "-" + pick;
        AtomicReference<QueryResult> q1 = new AtomicReference<>();
        await("queryMessage by key " + oneKey, () -> {
            try {
                QueryResult q = p.queryMessage(topic, oneKey, 32, begin, nowMs() + 60_000);
                q1.set(q);
                return q.getMessageList().size() >= 1;
            } catch (Exception e) {
                return false;
            }
        });
        for (MessageExt m : q1.get().getMessageList()) {
            check(m.getKeys().contains(oneKey), "queryMessage(" + oneKey + ") returned keys " + m.getKeys());
        }
        check(q1.get().getMessageList().stream().anyMatch(m -> m.getMsgId().equals(rs.get(pick).getMsgId())),
            "queryMessage(" + oneKey + ") misses " + rs.get(pick).getMsgId());
        String allKey = "qk-" + run + "-all";
        Set<String> found = ConcurrentHashMap.newKeySet();
        await("queryMessage by key " + allKey + " returns all " + n, () -> {
            try {
                for (MessageExt m : p.queryMessage(topic, allKey, 64, begin, nowMs() + 60_000).getMessageList()) {
                    found.add(m.getMsgId());
                }
            } catch (Exception e) {
                return false;
            }
            return found.size() >= n;
        });
        for (SendResult r : rs) {
            check(found.contains(r.getMsgId()), "queryMessage(" + allKey + ") misses " + r.getMsgId());
        }
        int byUniq = 0;
        for (SendResult r : rs) {
            MessageExt m = p.getDefaultMQProducerImpl().queryMessageByUniqKey(topic, r.getMsgId());
            check(m != null && r.getMsgId().equals(m.getMsgId()), "queryMessageByUniqKey(" + r.getMsgId() + ") returned "
                + (m == null ? null : m.getMsgId()));
            byUniq++;
        }
        // Queue offsets: max/min, the earliest store time and search by timestamp.
        SendResult first = rs.get(0);
        MessageQueue mq = first.getMessageQueue();
        MessageExt firstMsg = p.viewMessage(topic, first.getOffsetMsgId());
        long max = p.maxOffset(mq), min = p.minOffset(mq);
        check(max > first.getQueueOffset() && min <= first.getQueueOffset(), "queue offsets [" + min + "," + max + ") exclude "
            + first.getQueueOffset());
        long earliest = p.earliestMsgStoreTime(mq);
        check(earliest > 0 && earliest <= firstMsg.getStoreTimestamp(), "earliestMsgStoreTime " + earliest + " > "
            + firstMsg.getStoreTimestamp());
        long byTime = p.searchOffset(mq, firstMsg.getStoreTimestamp());
        check(byTime <= first.getQueueOffset() && byTime >= min, "searchOffset(store time of offset " + first.getQueueOffset()
            + ") = " + byTime);
        out.put("sent", n);
        out.put("viewed_by_offset_msg_id", n);
        out.put("by_key_one", q1.get().getMessageList().size());
        out.put("by_key_all", found.size());
        out.put("by_unique_key", byUniq);
        out.put("queue", mq.getQueueId());
        out.put("min_max_offset", List.of(min, max));
        out.put("search_offset", byTime);
    }

    /** Consumer progress (commit, committed) and a reset by time (offsetForTimestamp + seek). */
    void progress() throws Exception {
        int n = count(20);
        DefaultMQProducer p = producer(group + "_p");
        List<String> first = new ArrayList<>(), second = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            SendResult r = p.send(msg(topic, "P", null, "first-" + i));
            sendOk(r, "first-" + i);
            first.add(r.getMsgId());
        }
        Sink s = new Sink();
        DefaultLitePullConsumer c = lite(group + "_c");
        c.setAutoCommit(false);
        c.subscribe(topic, "*");
        c.start();
        await("first half consumed", () -> {
            s.addAll(c.poll(), "first");
            return s.hasAllIds(first);
        });
        c.commitSync();
        Map<MessageQueue, Long> want = new HashMap<>();
        long t1 = 0;
        for (MessageQueue mq : c.fetchMessageQueues(topic)) {
            want.put(mq, 0L);
        }
        for (Got g : s.all) {
            t1 = Math.max(t1, g.storeTs());
            for (MessageQueue mq : want.keySet()) {
                if (mq.getQueueId() == g.queueId()) {
                    want.merge(mq, g.queueOffset() + 1, Math::max);
                }
            }
        }
        Map<String, Long> committed = new TreeMap<>();
        await("committed offsets equal the consumed ones", () -> {
            try {
                for (Map.Entry<MessageQueue, Long> e : want.entrySet()) {
                    Long got = c.committed(e.getKey());
                    committed.put(Integer.toString(e.getKey().getQueueId()), got);
                    if (e.getValue() > 0 && (got == null || got.longValue() != e.getValue())) {
                        return false;
                    }
                }
                return true;
            } catch (Exception e) {
                return false;
            }
        });
        final long t1f = t1;
        await("the clock to pass the last store time by 1 s", () -> nowMs() > t1f + 1_000);
        for (int i = 0; i < n; i++) {
            SendResult r = p.send(msg(topic, "P", null, "second-" + i));
            sendOk(r, "second-" + i);
            second.add(r.getMsgId());
        }
        await("second half consumed", () -> {
            s.addAll(c.poll(), "second");
            return s.hasAllIds(second);
        });
        c.commitSync();
        long t2 = Long.MAX_VALUE;
        Map<Integer, Long> firstSecond = new HashMap<>();
        for (String id : second) {
            Got g = s.byId.get(id).get(0);
            t2 = Math.min(t2, g.storeTs());
            firstSecond.merge(g.queueId(), g.queueOffset(), Math::min);
        }
        // Reset by time to the first store time of the second half: per queue, the first offset stored at or after.
        Map<String, Long> resetTo = new TreeMap<>();
        for (MessageQueue mq : want.keySet()) {
            long o = c.offsetForTimestamp(mq, t2);
            resetTo.put(Integer.toString(mq.getQueueId()), o);
            Long expect = firstSecond.get(mq.getQueueId());
            if (expect != null) {
                check(o == expect, "queue " + mq.getQueueId() + ": offsetForTimestamp(" + t2 + ") = " + o + ", first offset of "
                    + "the second half is " + expect);
            }
            c.seek(mq, o);
        }
        Sink again = new Sink();
        await("the second half again after the reset", () -> {
            again.addAll(c.poll(), "again");
            return again.hasAllIds(second);
        });
        for (String id : first) {
            check(!again.byId.containsKey(id), "after the reset to " + t2 + " the first half's " + id + " came again");
        }
        out.put("sent", 2 * n);
        out.put("committed_after_first", committed);
        out.put("reset_timestamp", t2);
        out.put("reset_offsets", resetTo);
        out.put("reread", again.byId.size());
    }

    /** 20,000 sync sends from 16 threads with the leader killed at a third; every SEND_OK id consumed. */
    void bulk() throws Exception {
        int n = count(20_000), threads = 16;
        Set<String> consumed = ConcurrentHashMap.newKeySet();
        AtomicLong deliveries = new AtomicLong();
        DefaultMQPushConsumer c = push(group + "_c", false);
        c.subscribe(topic, "*");
        c.setConsumeMessageBatchMaxSize(32);
        c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            for (MessageExt m : msgs) {
                consumed.add(m.getMsgId());
            }
            deliveries.addAndGet(msgs.size());
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        c.start();
        DefaultMQProducer p = producer(group + "_p");
        Killer killer = new Killer();
        Set<String> acked = ConcurrentHashMap.newKeySet();
        AtomicInteger next = new AtomicInteger(), failures = new AtomicInteger();
        Map<String, Integer> statuses = new ConcurrentHashMap<>();
        AtomicReference<Throwable> crash = new AtomicReference<>();
        List<Long> latNs = Collections.synchronizedList(new ArrayList<>());
        long t0 = System.nanoTime();
        List<Thread> ts = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            Thread th = new Thread(() -> {
                try {
                    int i;
                    while ((i = next.getAndIncrement()) < n) {
                        if (i == n / 3) {
                            killer.kill();
                        }
                        Message m = msg(topic, "Bulk", null, "bulk-" + i);
                        while (System.nanoTime() < deadlineNs) {
                            try {
                                long s0 = System.nanoTime();
                                SendResult r = p.send(m);
                                statuses.merge(r.getSendStatus().name(), 1, Integer::sum);
                                if (r.getSendStatus() == SendStatus.SEND_OK) {
                                    latNs.add(System.nanoTime() - s0);
                                    acked.add(r.getMsgId());
                                    killer.sendOk();
                                    break;
                                }
                            } catch (Exception e) {
                                statuses.merge(e.getClass().getSimpleName(), 1, Integer::sum);
                            }
                            failures.incrementAndGet();
                            Thread.sleep(100);   // back-off before resending the same message (same UNIQ_KEY)
                        }
                    }
                } catch (Throwable e) {
                    crash.compareAndSet(null, e);
                }
            });
            th.start();
            ts.add(th);
        }
        for (Thread th : ts) {
            th.join(Math.max(1, (deadlineNs - System.nanoTime()) / 1_000_000));
        }
        check(crash.get() == null, "sender thread failed: " + crash.get());
        long sendMs = (System.nanoTime() - t0) / 1_000_000;
        check(acked.size() >= n, "only " + acked.size() + " of " + n + " sends acknowledged before the deadline");
        await("every SEND_OK id consumed", () -> consumed.containsAll(acked));
        killer.finish();
        Set<String> missing = new HashSet<>(acked);
        missing.removeAll(consumed);
        out.put("attempted", n);
        out.put("acked", acked.size());
        out.put("send_failures", failures.get());
        out.put("statuses", new TreeMap<>(statuses));
        out.put("consumed_distinct", consumed.size());
        out.put("deliveries", deliveries.get());
        out.put("missing", missing.size());
        out.put("send_wall_ms", sendMs);
        out.put("send_latency", lat(latNs));
    }

    /**
     * For the mqadmin tests: a producer sends N messages with keys, a push consumer (group G_c, online) consumes
     * them; then one "ready" JSON line (ids, offsetMsgIds, keys, groups) and the program stays up until its stdin
     * closes (or the deadline), counting deliveries, so that consumerProgress, consumerConnection and
     * resetOffsetByTime see a live consumer. The final line reports the deliveries per message (a reset to an
     * earlier time shows as a second delivery).
     */
    void hold() throws Exception {
        int n = count(8);
        Sink sink = new Sink();
        DefaultMQPushConsumer c = push(group + "_c", false);
        c.subscribe(topic, "*");
        c.registerMessageListener(into(sink, "hold"));
        c.start();
        DefaultMQProducer p = producer(group + "_p");
        List<String> ids = new ArrayList<>(), offsetIds = new ArrayList<>(), keys = new ArrayList<>();
        String run = Long.toString(nowMs(), 36);
        for (int i = 0; i < n; i++) {
            String key = "hk-" + run + "-" + i;
            SendResult r = p.send(msg(topic, "Hold", key, "hold-" + i));
            sendOk(r, "hold-" + i);
            ids.add(r.getMsgId());
            offsetIds.add(r.getOffsetMsgId());
            keys.add(key);
        }
        await("the held consumer got every message", () -> sink.hasAllIds(ids));
        long lastStore = 0;
        for (Got g : sink.all) {
            lastStore = Math.max(lastStore, g.storeTs());
        }
        Map<String, Object> ready = new LinkedHashMap<>();
        ready.put("ready", true);
        ready.put("consumer_group", group + "_c");
        ready.put("producer_group", group + "_p");
        ready.put("client_id", c.buildMQClientId());
        ready.put("ids", ids);
        ready.put("offset_msg_ids", offsetIds);
        ready.put("keys", keys);
        ready.put("first_store_ms", sink.byId.get(ids.get(0)).get(0).storeTs());
        ready.put("last_store_ms", lastStore);
        System.out.println(Json.write(ready));
        System.out.flush();
        // Each line on stdin asks for a status line (deliveries per id so far); EOF ends the hold.
        Thread stdin = new Thread(() -> {
            try {
                java.io.BufferedReader in = new java.io.BufferedReader(new java.io.InputStreamReader(System.in,
                    StandardCharsets.UTF_8));
                while (in.readLine() != null) {
                    Map<String, Object> st = new LinkedHashMap<>();
                    Map<String, Integer> d = new TreeMap<>();
                    for (String id : ids) {
                        d.put(id, sink.byId.get(id).size());
                    }
                    st.put("status", true);
                    st.put("deliveries", d);
                    System.out.println(Json.write(st));
                    System.out.flush();
                }
            } catch (java.io.IOException ignored) {
                // closed
            }
        });
        stdin.setDaemon(true);
        stdin.start();
        stdin.join(Math.max(1, (deadlineNs - System.nanoTime()) / 1_000_000));
        Map<String, Integer> deliveries = new TreeMap<>();
        for (String id : ids) {
            deliveries.put(id, sink.byId.get(id).size());
        }
        out.put("deliveries", deliveries);
        out.put("held_until_eof", !stdin.isAlive());
    }

    // ---------------------------------------------------------------------------------------- main
    void run() throws Exception {
        switch (scenario) {
            case "send" -> send();
            case "push-tags" -> pushTags();
            case "lite-pull" -> litePull();
            case "orderly" -> orderly();
            case "delay" -> delay();
            case "retry-dlq" -> retryDlq();
            case "txn" -> txn();
            case "sql92" -> sql92();
            case "query" -> query();
            case "progress" -> progress();
            case "bulk" -> bulk();
            case "hold" -> hold();
            default -> throw new IllegalArgumentException("unknown scenario " + scenario);
        }
    }

    public static void main(String[] args) {
        Scenarios s = new Scenarios();
        try {
            s.parse(args);
        } catch (IllegalArgumentException e) {
            System.out.println(Json.write(Map.of("ok", false, "reason", "bad arguments: " + e.getMessage())));
            System.exit(2);
        }
        if (s.tlsCa != null) {
            System.setProperty("tls.test.mode.enable", "false");
            System.setProperty("tls.client.trustCertPath", s.tlsCa);
        }
        s.out.put("scenario", s.scenario);
        s.out.put("client", MQVersion.getVersionDesc(MQVersion.CURRENT_VERSION));
        s.out.put("acl", s.ak != null);
        s.out.put("tls", s.tls);
        s.out.put("vip_channel", s.vip);
        s.startNs = System.nanoTime();
        s.deadlineNs = s.startNs + s.timeoutMs * 1_000_000;
        int code = 0;
        try {
            s.run();
            s.out.put("ok", true);
        } catch (Failure f) {
            s.out.put("ok", false);
            s.out.put("reason", f.getMessage());
            code = 1;
        } catch (Throwable t) {
            s.out.put("ok", false);
            s.out.put("reason", t.toString());
            t.printStackTrace();
            code = 1;
        }
        s.out.put("wall_ms", s.elapsedMs());
        // Clients shut down in reverse order (consumers persist offsets, all unregister), for at most 10 s.
        Collections.reverse(s.closers);
        Thread closer = new Thread(() -> {
            for (Runnable r : s.closers) {
                try {
                    r.run();
                } catch (RuntimeException ignored) {
                    // shutting down
                }
            }
        });
        closer.setDaemon(true);
        closer.start();
        try {
            closer.join(10_000);
        } catch (InterruptedException ignored) {
            Thread.currentThread().interrupt();
        }
        s.out.put("shutdown_ms", s.elapsedMs() - (Long) s.out.get("wall_ms"));
        System.out.println(Json.write(s.out));
        System.out.flush();
        System.exit(code);
    }
}

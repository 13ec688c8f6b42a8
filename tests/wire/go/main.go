// Command wirego runs the wire tier's scenarios with the official Go client (github.com/apache/rocketmq-client-go/v2)
// against a NameServer and prints one JSON line: {"scenario", "client", "ok", ...results}; exit 0, or
// {"ok": false, "reason"} and exit 1 (2 for bad arguments). The client's own log goes to stderr.
//
//	wirego -scenario NAME -namesrv HOST:PORT -topic T -group G [-ak AK -sk SK] [-count N] [-timeout S]
//	       [-kill-cmd CMD] [-restart-cmd CMD]
//
// Scenarios: send (sync, async, oneway, batch), push-tags (clustering TagA||TagB, 2 members), orderly (sharding
// key + hash selector, orderly consumer; -kill-cmd runs half-way), delay (level 1 and 2), txn (commit, rollback,
// check-back), pull (the PullConsumer: Subscribe + Poll + ACK), sql92.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/apache/rocketmq-client-go/v2/rlog"
)

const clientVersion = "rocketmq-client-go/v2 v2.1.2"

type failure struct{ reason string }

func fail(format string, args ...interface{}) { panic(failure{fmt.Sprintf(format, args...)}) }

func check(cond bool, format string, args ...interface{}) {
	if !cond {
		fail(format, args...)
	}
}

type runner struct {
	scenario, namesrv, topic, group, ak, sk, killCmd, restartCmd string
	count                                                         int
	deadline                                                      time.Time
	out                                                           map[string]interface{}
	closers                                                       []func()
	seq                                                           int32
}

func (r *runner) n(dflt int) int {
	if r.count > 0 {
		return r.count
	}
	return dflt
}

func (r *runner) instance() string {
	return fmt.Sprintf("wirego-%d-%d", os.Getpid(), atomic.AddInt32(&r.seq, 1))
}

func (r *runner) creds() primitive.Credentials {
	return primitive.Credentials{AccessKey: r.ak, SecretKey: r.sk}
}

// await polls cond every 20 ms until the scenario's deadline.
func (r *runner) await(what string, cond func() bool) {
	for !cond() {
		if time.Now().After(r.deadline) {
			fail("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *runner) producerOpts(group string) []producer.Option {
	opts := []producer.Option{
		producer.WithNsResolver(primitive.NewPassthroughResolver([]string{r.namesrv})),
		producer.WithGroupName(group),
		producer.WithInstanceName(r.instance()),
		producer.WithRetry(2),
		producer.WithSendMsgTimeout(3 * time.Second),
	}
	if r.ak != "" {
		opts = append(opts, producer.WithCredentials(r.creds()))
	}
	return opts
}

func (r *runner) producer(group string, extra ...producer.Option) rocketmq.Producer {
	p, err := rocketmq.NewProducer(append(r.producerOpts(group), extra...)...)
	check(err == nil, "new producer: %v", err)
	check(p.Start() == nil, "producer start failed")
	r.closers = append(r.closers, func() { _ = p.Shutdown() })
	return p
}

func (r *runner) consumerOpts(group string, extra ...consumer.Option) []consumer.Option {
	opts := []consumer.Option{
		consumer.WithNsResolver(primitive.NewPassthroughResolver([]string{r.namesrv})),
		consumer.WithGroupName(group),
		consumer.WithInstance(r.instance()),
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset),
	}
	if r.ak != "" {
		opts = append(opts, consumer.WithCredentials(r.creds()))
	}
	return append(opts, extra...)
}

// sink records every delivery by message id (UNIQ_KEY) and by body.
type sink struct {
	mu     sync.Mutex
	byID   map[string][]*primitive.MessageExt
	byBody map[string]int
	order  []*primitive.MessageExt
}

func newSink() *sink {
	return &sink{byID: map[string][]*primitive.MessageExt{}, byBody: map[string]int{}}
}

func (s *sink) add(msgs ...*primitive.MessageExt) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range msgs {
		s.byID[m.MsgId] = append(s.byID[m.MsgId], m)
		s.byBody[string(m.Body)]++
		s.order = append(s.order, m)
	}
}

func (s *sink) hasIDs(ids []string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if _, ok := s.byID[id]; !ok {
			return false
		}
	}
	return true
}

func (s *sink) hasBodies(bodies []string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range bodies {
		if s.byBody[b] == 0 {
			return false
		}
	}
	return true
}

func (s *sink) has(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.byID[id]
	return ok
}

func (s *sink) distinct() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byID)
}

func (r *runner) push(group string, topic string, sel consumer.MessageSelector, s *sink, extra ...consumer.Option) rocketmq.PushConsumer {
	c, err := rocketmq.NewPushConsumer(r.consumerOpts(group, extra...)...)
	check(err == nil, "new push consumer: %v", err)
	err = c.Subscribe(topic, sel, func(ctx context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		s.add(msgs...)
		return consumer.ConsumeSuccess, nil
	})
	check(err == nil, "subscribe: %v", err)
	check(c.Start() == nil, "push consumer start failed")
	r.closers = append(r.closers, func() { _ = c.Shutdown() })
	return c
}

func sendOK(res *primitive.SendResult, err error) *primitive.SendResult {
	check(err == nil, "send: %v", err)
	check(res != nil && res.Status == primitive.SendOK, "send: status %v", res)
	return res
}

func newMsg(topic, tag, body string, keys ...string) *primitive.Message {
	m := primitive.NewMessage(topic, []byte(body))
	if tag != "" {
		m.WithTag(tag)
	}
	if len(keys) > 0 {
		m.WithKeys(keys)
	}
	return m
}

func (r *runner) shell(what, cmd string) string {
	ctx, cancel := context.WithDeadline(context.Background(), r.deadline)
	defer cancel()
	c := exec.CommandContext(ctx, "bash", "-c", cmd)
	c.Stderr = os.Stderr
	o, err := c.Output()
	check(err == nil, "%s command failed: %s: %v", what, cmd, err)
	return strings.TrimSpace(string(o))
}

// ---------------------------------------------------------------------------------------------- scenarios

func (r *runner) send() {
	n := r.n(40)
	p := r.producer(r.group + "_p")
	acked := map[string]string{}
	var mu sync.Mutex
	ctx := context.Background()
	for i := 0; i < n; i++ {
		body := fmt.Sprintf("sync-%d", i)
		m := newMsg(r.topic, "TagA", body, "k-"+body)
		m.WithProperty("seq", strconv.Itoa(i))
		res := sendOK(p.SendSync(ctx, m))
		check(res.MsgID != "" && res.OffsetMsgID != "", "%s: no msgId/offsetMsgId", body)
		acked[res.MsgID] = body
	}
	var wg sync.WaitGroup
	var asyncErr []string
	for i := 0; i < n; i++ {
		body := fmt.Sprintf("async-%d", i)
		wg.Add(1)
		err := p.SendAsync(ctx, func(ctx context.Context, res *primitive.SendResult, err error) {
			defer wg.Done()
			mu.Lock()
			defer mu.Unlock()
			if err != nil || res.Status != primitive.SendOK {
				asyncErr = append(asyncErr, fmt.Sprintf("%s: %v %v", body, err, res))
				return
			}
			acked[res.MsgID] = body
		}, newMsg(r.topic, "TagB", body, "k-"+body))
		if err != nil {
			wg.Done()
			asyncErr = append(asyncErr, fmt.Sprintf("%s: %v", body, err))
		}
	}
	wg.Wait()
	check(len(asyncErr) == 0, "async sends failed: %v", asyncErr)
	var oneway []string
	for i := 0; i < n; i++ {
		body := fmt.Sprintf("oneway-%d", i)
		check(p.SendOneWay(ctx, newMsg(r.topic, "TagC", body, "k-"+body)) == nil, "oneway %s failed", body)
		oneway = append(oneway, body)
	}
	batches := 0
	var batchBodies, batchResults []string
	for i := 0; i < n; i += 10 {
		var ms []*primitive.Message
		for j := i; j < i+10 && j < n; j++ {
			body := fmt.Sprintf("batch-%d", j)
			ms = append(ms, newMsg(r.topic, "TagD", body, "k-"+body))
		}
		// v2.1.2 sets no UNIQ_KEY on a batch's messages and returns an empty MsgID for a batch: its messages
		// are checked by body (and their keys and tags below).
		res := sendOK(p.SendSync(ctx, ms...))
		for j := range ms {
			batchBodies = append(batchBodies, fmt.Sprintf("batch-%d", i+j))
		}
		batchResults = append(batchResults, res.MsgID)
		batches++
	}
	s := newSink()
	r.push(r.group+"_c", r.topic, consumer.MessageSelector{}, s)
	ids := make([]string, 0, len(acked))
	for id := range acked {
		ids = append(ids, id)
	}
	r.await("every acked id, batch body and oneway body", func() bool {
		return s.hasIDs(ids) && s.hasBodies(oneway) && s.hasBodies(batchBodies)
	})
	tagOf := map[string]string{"sync": "TagA", "async": "TagB", "batch": "TagD"}
	s.mu.Lock()
	for id, body := range acked {
		m := s.byID[id][0]
		check(string(m.Body) == body, "id %s: body %q != %q", id, m.Body, body)
		kind := body[:strings.Index(body, "-")]
		check(m.GetTags() == tagOf[kind], "id %s: tags %q", id, m.GetTags())
		check(m.GetKeys() == "k-"+body, "id %s: keys %q", id, m.GetKeys())
		if kind == "sync" {
			check(m.GetProperty("seq") == body[5:], "id %s: user property seq %q", id, m.GetProperty("seq"))
		}
	}
	for _, m := range s.order {
		if b := string(m.Body); strings.HasPrefix(b, "batch-") {
			check(m.GetTags() == "TagD" && m.GetKeys() == "k-"+b, "batch message %s: tags %q keys %q", b, m.GetTags(), m.GetKeys())
		}
	}
	s.mu.Unlock()
	r.out["batch_result_msg_ids"] = batchResults
	r.out["sent"] = map[string]int{"sync": n, "async": n, "oneway": n, "batch": n, "batches": batches}
	r.out["acked"] = len(acked)
	r.out["read"] = s.distinct()
}

func (r *runner) pushTags() {
	n := r.n(30)
	clu := newSink()
	sel := consumer.MessageSelector{Type: consumer.TAG, Expression: "TagA || TagB"}
	r.push(r.group+"_clu", r.topic, sel, clu)
	r.push(r.group+"_clu", r.topic, sel, clu)
	p := r.producer(r.group + "_p")
	ctx := context.Background()
	ids := map[string][]string{}
	queues := map[int]*primitive.MessageQueue{}
	for i := 0; i < n; i++ {
		for _, tag := range []string{"TagA", "TagB", "TagC"} {
			res := sendOK(p.SendSync(ctx, newMsg(r.topic, tag, fmt.Sprintf("%s-%d", tag, i))))
			ids[tag] = append(ids[tag], res.MsgID)
			queues[res.MessageQueue.QueueId] = res.MessageQueue
		}
	}
	// A TagA fence in every queue seen, after every TagC (manual queue selector).
	fp := r.producer(r.group+"_fence", producer.WithQueueSelector(producer.NewManualQueueSelector()))
	var fences []string
	for _, mq := range queues {
		m := newMsg(r.topic, "TagA", fmt.Sprintf("fence-%d", mq.QueueId))
		m.Queue = mq
		res := sendOK(fp.SendSync(ctx, m))
		check(res.MessageQueue.QueueId == mq.QueueId, "fence for queue %d went to %d", mq.QueueId, res.MessageQueue.QueueId)
		fences = append(fences, res.MsgID)
	}
	want := append(append(append([]string{}, ids["TagA"]...), ids["TagB"]...), fences...)
	r.await("clustering group got TagA and TagB", func() bool { return clu.hasIDs(want) })
	for _, id := range ids["TagC"] {
		check(!clu.has(id), "TagA || TagB group received TagC %s", id)
	}
	r.out["queues"] = len(queues)
	r.out["sent"] = map[string]int{"TagA": n, "TagB": n, "TagC": n, "fences": len(fences)}
	r.out["clustering_received"] = clu.distinct()
}

func (r *runner) orderly() {
	n, keys := r.n(200), 8
	s := newSink()
	r.push(r.group+"_c", r.topic, consumer.MessageSelector{}, s, consumer.WithConsumerOrder(true))
	p := r.producer(r.group+"_p", producer.WithQueueSelector(producer.NewHashQueueSelector()))
	ctx := context.Background()
	acked := map[int][]int{}
	queueOf := map[int]int{}
	var ids []string
	failures := 0
	killedAt, firstOK := time.Time{}, time.Time{}
	var restart sync.WaitGroup
	var restartErr atomic.Value
	for i := 0; i < n; i++ {
		if i == n/2 && r.killCmd != "" {
			r.out["kill_output"] = r.shell("kill", r.killCmd)
			killedAt = time.Now()
		}
		key, seq := i%keys, i/keys
		m := newMsg(r.topic, "Ord", fmt.Sprintf("%d:%d", key, seq), fmt.Sprintf("ord-%d", key))
		m.WithShardingKey(fmt.Sprintf("ord-%d", key))
		for {
			check(time.Now().Before(r.deadline), "could not send %d:%d before the deadline", key, seq)
			res, err := p.SendSync(ctx, m)
			if err == nil && res.Status == primitive.SendOK {
				acked[key] = append(acked[key], seq)
				ids = append(ids, res.MsgID)
				if q, ok := queueOf[key]; ok {
					check(q == res.MessageQueue.QueueId, "key %d sent to queue %d and %d", key, q, res.MessageQueue.QueueId)
				}
				queueOf[key] = res.MessageQueue.QueueId
				if !killedAt.IsZero() && firstOK.IsZero() {
					firstOK = time.Now()
					if r.restartCmd != "" {
						restart.Add(1)
						go func() {
							defer restart.Done()
							defer func() {
								if e := recover(); e != nil {
									restartErr.Store(fmt.Sprint(e))
								}
							}()
							r.shell("restart", r.restartCmd)
						}()
					}
				}
				break
			}
			failures++
			time.Sleep(100 * time.Millisecond) // back-off before resending the same message
		}
	}
	r.await("orderly consumer got every acked message", func() bool { return s.hasIDs(ids) })
	restart.Wait()
	check(restartErr.Load() == nil, "restart: %v", restartErr.Load())
	seen := map[int][]int{}
	s.mu.Lock()
	for _, m := range s.order {
		kv := strings.SplitN(string(m.Body), ":", 2)
		k, _ := strconv.Atoi(kv[0])
		v, _ := strconv.Atoi(kv[1])
		seen[k] = append(seen[k], v)
		check(m.Queue.QueueId == queueOf[k], "key %d read from queue %d, sent to %d", k, m.Queue.QueueId, queueOf[k])
	}
	s.mu.Unlock()
	for k, want := range acked {
		j := 0
		for _, v := range seen[k] {
			if j < len(want) && want[j] == v {
				j++
			}
		}
		check(j == len(want), "key %d: acked order %v is not a subsequence of consumed %v", k, want, seen[k])
	}
	r.out["sent_acked"] = len(ids)
	r.out["send_failures"] = failures
	r.out["consumed"] = len(s.order)
	if !killedAt.IsZero() && !firstOK.IsZero() {
		r.out["kill_to_first_send_ok_ms"] = firstOK.Sub(killedAt).Milliseconds()
	}
}

func (r *runner) delay() {
	n := r.n(3)
	s := newSink()
	r.push(r.group+"_c", r.topic, consumer.MessageSelector{}, s)
	p := r.producer(r.group + "_p")
	ctx := context.Background()
	notBefore := map[string]time.Time{}
	var ids []string
	for i := 0; i < n; i++ {
		for _, level := range []int{1, 2} {
			m := newMsg(r.topic, fmt.Sprintf("L%d", level), fmt.Sprintf("level%d-%d", level, i))
			m.WithDelayTimeLevel(level)
			t0 := time.Now()
			res := sendOK(p.SendSync(ctx, m))
			d := time.Second
			if level == 2 {
				d = 5 * time.Second
			}
			notBefore[res.MsgID] = t0.Add(d)
			ids = append(ids, res.MsgID)
		}
	}
	recv := map[string]time.Time{}
	r.await("every delayed message", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		for id := range s.byID {
			if _, ok := recv[id]; !ok {
				recv[id] = time.Now()
			}
		}
		return len(recv) >= len(ids) && func() bool {
			for _, id := range ids {
				if _, ok := recv[id]; !ok {
					return false
				}
			}
			return true
		}()
	})
	// recv is stamped when the poll above first saw the id (within 20 ms of delivery).
	minAfter := int64(1 << 62)
	for id, nb := range notBefore {
		ms := recv[id].Sub(nb).Milliseconds()
		check(ms >= -20, "message %s delivered %d ms before its delay", id, -ms)
		if ms < minAfter {
			minAfter = ms
		}
	}
	r.out["sent"] = len(ids)
	r.out["min_ms_after_due"] = minAfter
}

type txnListener struct {
	mu     sync.Mutex
	checks map[string]int
}

func (l *txnListener) ExecuteLocalTransaction(m *primitive.Message) primitive.LocalTransactionState {
	k := m.GetKeys()
	switch {
	case strings.HasPrefix(k, "commit-"):
		return primitive.CommitMessageState
	case strings.HasPrefix(k, "rollback-"):
		return primitive.RollbackMessageState
	}
	return primitive.UnknowState
}

func (l *txnListener) CheckLocalTransaction(m *primitive.MessageExt) primitive.LocalTransactionState {
	k := m.GetKeys()
	l.mu.Lock()
	l.checks[k]++
	l.mu.Unlock()
	switch {
	case strings.HasPrefix(k, "check-commit-"):
		return primitive.CommitMessageState
	case strings.HasPrefix(k, "check-rollback-"):
		return primitive.RollbackMessageState
	}
	return primitive.UnknowState
}

func (r *runner) txn() {
	n := r.n(2)
	l := &txnListener{checks: map[string]int{}}
	tp, err := rocketmq.NewTransactionProducer(l, r.producerOpts(r.group+"_p")...)
	check(err == nil, "new transaction producer: %v", err)
	check(tp.Start() == nil, "transaction producer start failed")
	r.closers = append(r.closers, func() { _ = tp.Shutdown() })
	s := newSink()
	r.push(r.group+"_c", r.topic, consumer.MessageSelector{}, s)
	ctx := context.Background()
	idOf := map[string]string{}
	states := map[string]string{}
	for i := 0; i < n; i++ {
		for _, kind := range []string{"commit", "rollback", "check-commit", "check-rollback"} {
			key := fmt.Sprintf("%s-%d", kind, i)
			res, err := tp.SendMessageInTransaction(ctx, newMsg(r.topic, "Txn", key, key))
			check(err == nil && res.Status == primitive.SendOK, "half message %s: %v %v", key, err, res)
			idOf[key] = res.MsgID
			states[key] = fmt.Sprint(res.State)
		}
	}
	var want, never []string
	for k, id := range idOf {
		if strings.Contains(k, "commit-") {
			want = append(want, id)
		} else {
			never = append(never, id)
		}
	}
	r.await("committed and checked-back-committed messages", func() bool { return s.hasIDs(want) })
	r.await("a check-back for every check-rollback message", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		for k := range idOf {
			if strings.HasPrefix(k, "check-") && l.checks[k] == 0 {
				return false
			}
		}
		return true
	})
	// A fence after the rollbacks were answered (round robin over the queues).
	p := r.producer(r.group + "_fence")
	var fences []string
	for i := 0; i < 8; i++ {
		res := sendOK(p.SendSync(ctx, newMsg(r.topic, "Fence", "fence")))
		fences = append(fences, res.MsgID)
	}
	r.await("fences", func() bool { return s.hasIDs(fences) })
	for _, id := range never {
		check(!s.has(id), "a rolled-back message was delivered: %s", id)
	}
	l.mu.Lock()
	for k := range idOf {
		if !strings.HasPrefix(k, "check-") {
			check(l.checks[k] == 0, "a check-back for the already resolved %s", k)
		}
	}
	r.out["check_backs"] = l.checks
	l.mu.Unlock()
	r.out["sent"] = len(idOf)
	r.out["local_states"] = states
}

func (r *runner) pull() {
	n := r.n(40)
	p := r.producer(r.group + "_p")
	ctx := context.Background()
	var ids []string
	for i := 0; i < n; i++ {
		ids = append(ids, sendOK(p.SendSync(ctx, newMsg(r.topic, "Pull", fmt.Sprintf("pull-%d", i)))).MsgID)
	}
	c, err := rocketmq.NewPullConsumer(r.consumerOpts(r.group + "_c")...)
	check(err == nil, "new pull consumer: %v", err)
	check(c.Subscribe(r.topic, consumer.MessageSelector{}) == nil, "pull subscribe failed")
	check(c.Start() == nil, "pull consumer start failed")
	r.closers = append(r.closers, func() { _ = c.Shutdown() })
	s := newSink()
	r.await("every message through Poll", func() bool {
		cr, err := c.Poll(ctx, 500*time.Millisecond)
		if err == nil && cr != nil {
			s.add(cr.GetMsgList()...)
			c.ACK(ctx, cr, consumer.ConsumeSuccess)
		} else if err != nil && !errors.Is(err, consumer.ErrNoNewMsg) {
			fmt.Fprintf(os.Stderr, "poll: %v\n", err)
		}
		return s.hasIDs(ids)
	})
	r.out["sent"] = n
	r.out["received"] = s.distinct()
}

func (r *runner) sql92() {
	n := r.n(30)
	expr := "a BETWEEN 3 AND 7 AND color = 'red'"
	s := newSink()
	r.push(r.group+"_sql", r.topic, consumer.MessageSelector{Type: consumer.SQL92, Expression: expr}, s)
	p := r.producer(r.group + "_p")
	ctx := context.Background()
	colors := []string{"red", "blue", "green", "red", "yellow"}
	var want []string
	all := map[string]bool{}
	for i := 0; i < n; i++ {
		m := newMsg(r.topic, "Sql", fmt.Sprintf("sql-%d", i))
		color, a := colors[i%len(colors)], i%10
		m.WithProperty("color", color)
		m.WithProperty("a", strconv.Itoa(a))
		res := sendOK(p.SendSync(ctx, m))
		all[res.MsgID] = true
		if a >= 3 && a <= 7 && color == "red" {
			want = append(want, res.MsgID)
		}
	}
	// Matching fences, one per send round robin over the queues, after every message above.
	for i := 0; i < 8; i++ {
		m := newMsg(r.topic, "Fence", "fence")
		m.WithProperty("color", "red")
		m.WithProperty("a", "5")
		want = append(want, sendOK(p.SendSync(ctx, m)).MsgID)
	}
	r.await("the matching messages", func() bool { return s.hasIDs(want) })
	wantSet := map[string]bool{}
	for _, id := range want {
		wantSet[id] = true
	}
	s.mu.Lock()
	for id := range s.byID {
		check(wantSet[id], "non-matching message delivered: %s", id)
	}
	s.mu.Unlock()
	r.out["sent"] = n
	r.out["matched"] = len(want) - 8
	r.out["expression"] = expr
}

// ---------------------------------------------------------------------------------------------- main

func main() {
	r := &runner{out: map[string]interface{}{}}
	fs := flag.NewFlagSet("wirego", flag.ContinueOnError)
	fs.StringVar(&r.scenario, "scenario", "", "scenario name")
	fs.StringVar(&r.namesrv, "namesrv", "", "NameServer host:port")
	fs.StringVar(&r.topic, "topic", "", "topic (exists)")
	fs.StringVar(&r.group, "group", "", "group name prefix (fresh)")
	fs.StringVar(&r.ak, "ak", "", "AccessKey (ACL)")
	fs.StringVar(&r.sk, "sk", "", "SecretKey (ACL)")
	fs.StringVar(&r.killCmd, "kill-cmd", "", "command that kills the leader (orderly)")
	fs.StringVar(&r.restartCmd, "restart-cmd", "", "command that restarts it")
	fs.IntVar(&r.count, "count", 0, "messages (scenario default when 0)")
	timeout := fs.Int("timeout", 120, "seconds")
	fs.SetOutput(os.Stderr)
	if err := fs.Parse(os.Args[1:]); err != nil || r.scenario == "" || r.namesrv == "" || r.topic == "" || r.group == "" ||
		(r.ak == "") != (r.sk == "") {
		b, _ := json.Marshal(map[string]interface{}{"ok": false, "reason": "bad arguments: need -scenario -namesrv -topic -group (and -ak with -sk)"})
		fmt.Println(string(b))
		os.Exit(2)
	}
	if os.Getenv("ROCKETMQ_GO_LOG_LEVEL") == "" {
		rlog.SetLogLevel("warn")
	}
	start := time.Now()
	r.deadline = start.Add(time.Duration(*timeout) * time.Second)
	r.out["scenario"] = r.scenario
	r.out["client"] = clientVersion
	r.out["acl"] = r.ak != ""
	code := 0
	func() {
		defer func() {
			if e := recover(); e != nil {
				r.out["ok"] = false
				if f, ok := e.(failure); ok {
					r.out["reason"] = f.reason
				} else {
					r.out["reason"] = fmt.Sprint(e)
				}
				code = 1
			}
		}()
		switch r.scenario {
		case "send":
			r.send()
		case "push-tags":
			r.pushTags()
		case "orderly":
			r.orderly()
		case "delay":
			r.delay()
		case "txn":
			r.txn()
		case "pull":
			r.pull()
		case "sql92":
			r.sql92()
		default:
			fail("unknown scenario %s", r.scenario)
		}
		r.out["ok"] = true
	}()
	r.out["wall_ms"] = time.Since(start).Milliseconds()
	for i := len(r.closers) - 1; i >= 0; i-- {
		r.closers[i]()
	}

	b, err := json.Marshal(r.out)
	if err != nil {
		b = []byte(fmt.Sprintf(`{"ok":false,"reason":%q}`, err.Error()))
		code = 1
	}
	fmt.Println(string(b))
	os.Exit(code)
}

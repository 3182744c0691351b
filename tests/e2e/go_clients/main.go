// The Go Kafka clients users run, against a gateway's Kafka listener (tests/e2e/test_kafka_go_clients.py):
// franz-go (with its admin client), IBM's sarama and segmentio's kafka-go. Each creates a topic,
// produces keyed records (compressed, acks=all; idempotent where the client offers it), reads them
// all back in a consumer group, commits, and checks what it can (offsets, headers, lag).
//
//	go-clients BOOTSTRAP franz|franz848|franztxn|sarama|kafkago
//	go-clients BOOTSTRAP franzchurn TAG STAGES WORKERS PROTOCOL STRATEGY STATIC
//
// franz848: two franz-go members of one group on Kafka 4's consumer protocol (KIP-848,
// kgo.ServerSideBalancer with the uniform assignor): the second joins while the first reads,
// both end up holding partitions, every record is read.
//
// franztxn: franz-go's GroupTransactSession moves a topic to another exactly once (below).
//
// Exits 1 with "FAIL: ..." on stderr on the first thing that is not as Kafka would have it.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

const n = 3000

func fail(f string, a ...any) { fmt.Fprintf(os.Stderr, "FAIL: "+f+"\n", a...); os.Exit(1) }

func franz(boot, topic string) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	adm, err := kgo.NewClient(kgo.SeedBrokers(boot))
	if err != nil {
		fail("client: %v", err)
	}
	ad := kadm.NewClient(adm)
	if _, err := ad.CreateTopic(ctx, 3, 1, map[string]*string{"retention.ms": kadm.StringPtr("86400000")}, topic); err != nil {
		fail("create: %v", err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(boot), kgo.ProducerBatchCompression(kgo.Lz4Compression()), kgo.RequiredAcks(kgo.AllISRAcks()))
	if err != nil {
		fail("producer: %v", err)
	}
	var wg sync.WaitGroup
	var perr error
	var mu sync.Mutex
	for i := 0; i < n; i++ {
		wg.Add(1)
		r := &kgo.Record{Topic: topic, Key: []byte("k" + strconv.Itoa(i%17)), Value: []byte(strconv.Itoa(i)), Headers: []kgo.RecordHeader{{Key: "h", Value: []byte("v")}}}
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				perr = err
				mu.Unlock()
			}
			wg.Done()
		})
	}
	wg.Wait()
	if perr != nil {
		fail("produce: %v", perr)
	}
	cl.Close()
	ends, err := ad.ListEndOffsets(ctx, topic)
	if err != nil {
		fail("list offsets: %v", err)
	}
	total := int64(0)
	ends.Each(func(o kadm.ListedOffset) { total += o.Offset })
	if total != n {
		fail("end offsets sum %d", total)
	}
	cons, err := kgo.NewClient(kgo.SeedBrokers(boot), kgo.ConsumerGroup("franz-g"), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit())
	if err != nil {
		fail("consumer: %v", err)
	}
	seen := map[string]bool{}
	last := map[int32]int64{}
	for len(seen) < n {
		fs := cons.PollFetches(ctx)
		if errs := fs.Errors(); len(errs) > 0 {
			fail("fetch: %v", errs)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if p, ok := last[r.Partition]; ok && r.Offset != p+1 {
				fail("gap p%d %d after %d", r.Partition, r.Offset, p)
			}
			last[r.Partition] = r.Offset
			if len(r.Headers) != 1 || string(r.Headers[0].Value) != "v" {
				fail("headers %v", r.Headers)
			}
			seen[string(r.Value)] = true
		})
	}
	if err := cons.CommitUncommittedOffsets(ctx); err != nil {
		fail("commit: %v", err)
	}
	cons.Close()
	lag, err := ad.Lag(ctx, "franz-g")
	if err != nil {
		fail("lag: %v", err)
	}
	if l := lag["franz-g"].Lag.Total(); l != 0 {
		fail("lag %d", l)
	}
	fmt.Println("franz-go ok", len(seen))
}

func franz848(boot, topic string) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	adm, err := kgo.NewClient(kgo.SeedBrokers(boot))
	if err != nil {
		fail("client: %v", err)
	}
	ad := kadm.NewClient(adm)
	if _, err := ad.CreateTopic(ctx, 6, 1, nil, topic); err != nil {
		fail("create: %v", err)
	}
	for i := 0; i < n; i++ {
		r := &kgo.Record{Topic: topic, Key: []byte("k" + strconv.Itoa(i%29)), Value: []byte(strconv.Itoa(i))}
		adm.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil {
				fail("produce: %v", err)
			}
		})
	}
	if err := adm.Flush(ctx); err != nil {
		fail("flush: %v", err)
	}
	member := func() *kgo.Client {
		cl, err := kgo.NewClient(kgo.SeedBrokers(boot), kgo.ConsumerGroup("franz-848"), kgo.ConsumeTopics(topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.ServerSideBalancer(), kgo.Balancers(kgo.StickyBalancer()),
			kgo.FetchMaxPartitionBytes(4096))
		if err != nil {
			fail("consumer: %v", err)
		}
		return cl
	}
	seen := map[string]bool{}
	got := map[*kgo.Client]int{}
	poll := func(cl *kgo.Client) {
		pctx, pcancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer pcancel()
		fs := cl.PollRecords(pctx, 50)
		for _, fe := range fs.Errors() {
			if !errors.Is(fe.Err, context.DeadlineExceeded) && !errors.Is(fe.Err, context.Canceled) {
				fail("fetch: %v", fe.Err)
			}
		}
		fs.EachRecord(func(r *kgo.Record) { seen[string(r.Value)] = true; got[cl]++ })
	}
	a := member()
	for len(seen) < n/10 && ctx.Err() == nil {
		poll(a)
	}
	b := member()
	for len(seen) < n && ctx.Err() == nil {
		poll(a)
		poll(b)
	}
	if len(seen) != n {
		fail("read %d of %d records", len(seen), n)
	}
	if got[a] == 0 || got[b] == 0 {
		fail("the second member never got partitions: %d and %d records", got[a], got[b])
	}
	described, err := ad.DescribeConsumerGroups(ctx, "franz-848")
	if err != nil {
		fail("describe: %v", err)
	}
	if d := described["franz-848"]; d.Err != nil || len(d.Members) != 2 {
		fail("described %+v", d)
	}
	a.Close()
	b.Close()
	fmt.Println("franz-go 848 ok", len(seen), got[a], got[b])
}

// franzchurn: the churning chain of consumer groups (tests/e2e/churn.py) with franz-go members:
// each stage's group reads topic i and produces every record into topic i+1; each member lives a
// random 1-3 s, commits what it processed on revoke (after flushing what it produced) and leaves,
// and a new member takes its place. Runs until stdin closes, then prints "started=N" and
// " kind=count" for what the clients reported.
func franzChurn(boot, tag string, stages, workers int, protocol, strategy string, static bool) {
	var stop atomic.Bool
	var started atomic.Int64
	var mu sync.Mutex
	counts := map[string]int{}
	count := func(kind string) {
		mu.Lock()
		counts[strings.ReplaceAll(kind, " ", "_")]++
		mu.Unlock()
	}
	member := func(stage, slot int) {
		src, dst := fmt.Sprintf("churn-%s-%d", tag, stage), fmt.Sprintf("churn-%s-%d", tag, stage+1)
		seeds := strings.Split(boot, ",")
		prod, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ProducerBatchCompression(kgo.SnappyCompression()), kgo.ProducerLinger(5*time.Millisecond))
		if err != nil {
			count("producer not created")
			time.Sleep(100 * time.Millisecond)
			return
		}
		defer prod.Close()
		var pmu sync.Mutex
		processed := map[int32]int64{}
		var cl *kgo.Client
		commit := func(ctx context.Context, parts []int32, drop bool) {
			if err := prod.Flush(ctx); err != nil { // what was produced is acked before its input is committed
				count("flush")
			}
			pmu.Lock()
			offsets := map[int32]kgo.EpochOffset{}
			for _, p := range parts {
				if o, ok := processed[p]; ok {
					offsets[p] = kgo.EpochOffset{Epoch: -1, Offset: o}
				}
			}
			pmu.Unlock()
			if len(offsets) > 0 {
				cl.CommitOffsetsSync(ctx, map[string]map[int32]kgo.EpochOffset{src: offsets}, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
					if err != nil {
						count("commit request failed")
						return
					}
					for _, t := range resp.Topics {
						for _, p := range t.Partitions {
							if e, ok := kerr.ErrorForCode(p.ErrorCode).(*kerr.Error); ok {
								count("commit " + e.Message)
							}
						}
					}
				})
			}
			if drop {
				pmu.Lock()
				for _, p := range parts {
					delete(processed, p)
				}
				pmu.Unlock()
			}
		}
		all := func() []int32 {
			pmu.Lock()
			defer pmu.Unlock()
			out := make([]int32, 0, len(processed))
			for p := range processed {
				out = append(out, p)
			}
			return out
		}
		opts := []kgo.Opt{
			kgo.SeedBrokers(seeds...), kgo.ConsumerGroup(src), kgo.ConsumeTopics(src), kgo.DisableAutoCommit(),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.BlockRebalanceOnPoll(),
			// franz-go adds a partition whose start it had to look up (ListOffsets: never committed)
			// to its fetches only once the long poll in flight ends, and by default that waits 5 s
			// (the same against Kafka). Members here live 1-3 s: a member given such a partition
			// and one with nothing left to read would end before fetching it, and the next one too.
			// Java's and librdkafka's default wait is 500 ms.
			kgo.FetchMaxWait(500 * time.Millisecond),
			kgo.OnPartitionsRevoked(func(ctx context.Context, _ *kgo.Client, m map[string][]int32) { commit(ctx, m[src], true) }),
			kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
				count("partitions lost")
				pmu.Lock()
				for _, p := range m[src] {
					delete(processed, p)
				}
				pmu.Unlock()
			}),
		}
		balancer := kgo.CooperativeStickyBalancer()
		if strategy == "range" {
			balancer = kgo.RangeBalancer()
		}
		if protocol == "consumer" {
			balancer = kgo.StickyBalancer() // the server's uniform assignor
			if strategy == "range" {
				balancer = kgo.RangeBalancer()
			}
			opts = append(opts, kgo.ServerSideBalancer())
		} else {
			opts = append(opts, kgo.SessionTimeout(6*time.Second), kgo.HeartbeatInterval(500*time.Millisecond))
		}
		opts = append(opts, kgo.Balancers(balancer))
		if static {
			opts = append(opts, kgo.InstanceID(fmt.Sprintf("%s-%d-%d", tag, stage, slot)))
		}
		cl, err = kgo.NewClient(opts...)
		if err != nil {
			count("consumer not created")
			time.Sleep(100 * time.Millisecond)
			return
		}
		started.Add(1)
		until := time.Now().Add(time.Duration(1000+rand.Intn(2000)) * time.Millisecond)
		lastCommit := time.Now()
		for time.Now().Before(until) && !stop.Load() {
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			fs := cl.PollRecords(ctx, 200)
			cancel()
			fs.EachRecord(func(r *kgo.Record) {
				prod.Produce(context.Background(), &kgo.Record{Topic: dst, Key: r.Key, Value: r.Value}, func(_ *kgo.Record, err error) {
					if err != nil {
						count("produce failed")
					}
				})
				pmu.Lock()
				processed[r.Partition] = r.Offset + 1
				pmu.Unlock()
			})
			cl.AllowRebalance()
			if time.Since(lastCommit) > time.Second {
				commit(context.Background(), all(), false)
				lastCommit = time.Now()
			}
		}
		commit(context.Background(), all(), false)
		cl.Close() // revokes (committing) and leaves
	}
	var wg sync.WaitGroup
	for s := 0; s < stages; s++ {
		for n := 0; n < workers; n++ {
			wg.Add(1)
			go func(stage, slot int) {
				defer wg.Done()
				for !stop.Load() {
					member(stage, slot)
				}
			}(s, n)
		}
	}
	io.Copy(io.Discard, os.Stdin) // run until the caller closes our stdin
	stop.Store(true)
	wg.Wait()
	out := fmt.Sprintf("started=%d", started.Load())
	mu.Lock()
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		out += fmt.Sprintf(" %s=%d", k, counts[k])
	}
	mu.Unlock()
	fmt.Println(out)
}

type handler struct {
	seen map[string]bool
	mu   *sync.Mutex
	done chan struct{}
}

func (h handler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (h handler) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (h handler) ConsumeClaim(s sarama.ConsumerGroupSession, c sarama.ConsumerGroupClaim) error {
	for m := range c.Messages() {
		h.mu.Lock()
		h.seen[string(m.Value)] = true
		k := len(h.seen)
		h.mu.Unlock()
		s.MarkMessage(m, "")
		if k == n {
			select {
			case <-h.done:
			default:
				close(h.done)
			}
		}
	}
	return nil
}

func saramaProbe(boot, topic string) {
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V3_6_0_0
	cfg.Producer.Idempotent = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Compression = sarama.CompressionZSTD
	cfg.Producer.Return.Successes = true
	cfg.Net.MaxOpenRequests = 1
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	adm, err := sarama.NewClusterAdmin([]string{boot}, cfg)
	if err != nil {
		fail("admin: %v", err)
	}
	if err := adm.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 3, ReplicationFactor: 1}, false); err != nil {
		fail("create: %v", err)
	}
	p, err := sarama.NewSyncProducer([]string{boot}, cfg)
	if err != nil {
		fail("producer: %v", err)
	}
	msgs := make([]*sarama.ProducerMessage, 0, n)
	for i := 0; i < n; i++ {
		msgs = append(msgs, &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder("k" + strconv.Itoa(i%17)), Value: sarama.StringEncoder(strconv.Itoa(i))})
	}
	if err := p.SendMessages(msgs); err != nil {
		fail("send: %v", err)
	}
	p.Close()
	g, err := sarama.NewConsumerGroup([]string{boot}, "sarama-g", cfg)
	if err != nil {
		fail("group: %v", err)
	}
	h := handler{seen: map[string]bool{}, mu: &sync.Mutex{}, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for ctx.Err() == nil {
			if err := g.Consume(ctx, []string{topic}, h); err != nil && ctx.Err() == nil {
				fail("consume: %v", err)
			}
		}
	}()
	select {
	case <-h.done:
	case <-time.After(90 * time.Second):
		fail("sarama saw %d", len(h.seen))
	}
	cancel()
	g.Close()
	offs, err := adm.ListConsumerGroupOffsets("sarama-g", map[string][]int32{topic: {0, 1, 2}})
	if err != nil {
		fail("offsets: %v", err)
	}
	sum := int64(0)
	for _, b := range offs.Blocks[topic] {
		sum += b.Offset
	}
	if sum != n {
		fail("committed %d", sum)
	}
	adm.Close()
	fmt.Println("sarama ok", len(h.seen))
}

func kafkaGo(boot, topic string) {
	conn, err := kafkago.Dial("tcp", boot)
	if err != nil {
		fail("dial: %v", err)
	}
	ctrl, err := conn.Controller()
	if err != nil {
		fail("controller: %v", err)
	}
	cc, err := kafkago.Dial("tcp", fmt.Sprintf("%s:%d", ctrl.Host, ctrl.Port))
	if err != nil {
		fail("dial controller: %v", err)
	}
	if err := cc.CreateTopics(kafkago.TopicConfig{Topic: topic, NumPartitions: 3, ReplicationFactor: 1}); err != nil {
		fail("create: %v", err)
	}
	w := &kafkago.Writer{Addr: kafkago.TCP(boot), Topic: topic, Balancer: &kafkago.Hash{}, RequiredAcks: kafkago.RequireAll, Compression: kafkago.Snappy, BatchTimeout: 5 * time.Millisecond}
	msgs := make([]kafkago.Message, 0, n)
	for i := 0; i < n; i++ {
		msgs = append(msgs, kafkago.Message{Key: []byte("k" + strconv.Itoa(i%17)), Value: []byte(strconv.Itoa(i))})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		fail("write: %v", err)
	}
	w.Close()
	r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: []string{boot}, GroupID: "kafkago-g", Topic: topic, StartOffset: kafkago.FirstOffset, MaxWait: 100 * time.Millisecond})
	seen := map[string]bool{}
	batch := []kafkago.Message{}
	for len(seen) < n {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			fail("fetch: %v (saw %d)", err, len(seen))
		}
		seen[string(m.Value)] = true
		batch = append(batch, m) // committed 500 at a time: each OffsetCommit is a Delta commit (~20 ms)
		if len(batch) == 500 || len(seen) == n {
			if err := r.CommitMessages(ctx, batch...); err != nil {
				fail("commit: %v", err)
			}
			batch = batch[:0]
		}
	}
	r.Close()
	fmt.Println("kafka-go ok", len(seen))
}

// franzTxn: franz-go's GroupTransactSession ETL (its exactly-once consume-transform-produce): read
// IN in a group with read_committed, write each record to OUT in transactions that commit the group's
// offsets, then check OUT holds every record once and the group has no lag.
func franzTxn(boot, in, out string) {
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	adm, err := kgo.NewClient(kgo.SeedBrokers(boot))
	if err != nil {
		fail("client: %v", err)
	}
	ad := kadm.NewClient(adm)
	for _, t := range []string{in, out} {
		if _, err := ad.CreateTopic(ctx, 3, 1, nil, t); err != nil {
			fail("create %s: %v", t, err)
		}
	}
	feeder, err := kgo.NewClient(kgo.SeedBrokers(boot))
	if err != nil {
		fail("feeder: %v", err)
	}
	recs := make([]*kgo.Record, 0, n)
	for i := 0; i < n; i++ {
		recs = append(recs, &kgo.Record{Topic: in, Key: []byte("k" + strconv.Itoa(i%17)), Value: []byte(strconv.Itoa(i))})
	}
	if err := feeder.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		fail("feed: %v", err)
	}
	feeder.Close()
	sess, err := kgo.NewGroupTransactSession(
		kgo.SeedBrokers(boot),
		kgo.TransactionalID("franz-etl"),
		kgo.TransactionTimeout(60*time.Second),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.RequireStableFetchOffsets(),
		kgo.ConsumerGroup("franz-txn-g"),
		kgo.ConsumeTopics(in),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	)
	if err != nil {
		fail("session: %v", err)
	}
	moved := 0
	for moved < n {
		fs := sess.PollFetches(ctx)
		if errs := fs.Errors(); len(errs) > 0 {
			fail("fetch: %v", errs)
		}
		if err := sess.Begin(); err != nil {
			fail("begin: %v", err)
		}
		var batch int
		var perr atomic.Value
		fs.EachRecord(func(r *kgo.Record) {
			batch++
			sess.Produce(ctx, &kgo.Record{Topic: out, Key: r.Key, Value: r.Value}, func(_ *kgo.Record, err error) {
				if err != nil {
					perr.Store(err)
				}
			})
		})
		if e := perr.Load(); e != nil {
			fail("produce: %v", e)
		}
		committed, err := sess.End(ctx, kgo.TryCommit)
		if err != nil {
			fail("end: %v", err)
		}
		if committed {
			moved += batch
		}
	}
	sess.Close()
	cons, err := kgo.NewClient(
		kgo.SeedBrokers(boot),
		kgo.ConsumeTopics(out),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
	)
	if err != nil {
		fail("reader: %v", err)
	}
	seen := map[string]int{}
	for total := 0; total < n; {
		fs := cons.PollFetches(ctx)
		if errs := fs.Errors(); len(errs) > 0 {
			fail("read: %v", errs)
		}
		fs.EachRecord(func(r *kgo.Record) {
			seen[string(r.Value)]++
			total++
		})
	}
	cons.Close()
	for v, c := range seen {
		if c != 1 {
			fail("record %s written %d times", v, c)
		}
	}
	// the last transaction's offsets land just after its records (EndTxn is answered once decided)
	for try_ := 0; ; try_++ {
		lag, err := ad.Lag(ctx, "franz-txn-g")
		if err != nil {
			fail("lag: %v", err)
		}
		l := lag["franz-txn-g"].Lag.Total()
		if l == 0 {
			break
		}
		if try_ == 100 {
			fail("lag %d", l)
		}
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Println("franz-go txn ok", len(seen))
}

func main() {
	boot, which := os.Args[1], os.Args[2]
	switch which {
	case "franz":
		franz(boot, "go-franz")
	case "franz848":
		franz848(boot, "go-franz-848")
	case "franzchurn": // TAG STAGES WORKERS PROTOCOL STRATEGY STATIC
		stages, _ := strconv.Atoi(os.Args[4])
		workers, _ := strconv.Atoi(os.Args[5])
		franzChurn(boot, os.Args[3], stages, workers, os.Args[6], os.Args[7], os.Args[8] == "true")
	case "franztxn":
		franzTxn(boot, "go-txn-in", "go-txn-out")
	case "sarama":
		saramaProbe(boot, "go-sarama")
	case "kafkago":
		kafkaGo(boot, "go-kafkago")
	default:
		fail("unknown client %q: franz, sarama or kafkago", which)
	}
}

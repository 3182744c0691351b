// The Go Kafka clients users run, against a gateway's Kafka listener (tests/e2e/test_kafka_go_clients.py):
// franz-go (with its admin client), IBM's sarama and segmentio's kafka-go. Each creates a topic,
// produces keyed records (compressed, acks=all; idempotent where the client offers it), reads them
// all back in a consumer group, commits, and checks what it can (offsets, headers, lag).
//
//	go-clients BOOTSTRAP franz|franz848|sarama|kafkago
//
// franz848: two franz-go members of one group on Kafka 4's consumer protocol (KIP-848,
// kgo.ServerSideBalancer with the uniform assignor): the second joins while the first reads,
// both end up holding partitions, every record is read.
//
// Exits 1 with "FAIL: ..." on stderr on the first thing that is not as Kafka would have it.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/IBM/sarama"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
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

func main() {
	boot, which := os.Args[1], os.Args[2]
	switch which {
	case "franz":
		franz(boot, "go-franz")
	case "franz848":
		franz848(boot, "go-franz-848")
	case "sarama":
		saramaProbe(boot, "go-sarama")
	case "kafkago":
		kafkaGo(boot, "go-kafkago")
	default:
		fail("unknown client %q: franz, sarama or kafkago", which)
	}
}

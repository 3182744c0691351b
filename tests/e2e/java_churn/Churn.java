// The churning chain of consumer groups (tests/e2e/churn.py) with Kafka's own Java client: each of
// STAGES groups reads topic i and produces every record into topic i+1; each member lives a random
// 1-3 s, commits what it processed on revoke (after flushing what it produced) and leaves, and a
// new member takes its place. Runs until its stdin closes, then prints one line:
// "started=N" followed by " kind=count" for what the clients reported.
//
//   java -cp <classes>:<kafka libs>/* Churn BOOTSTRAP TAG STAGES WORKERS PROTOCOL STRATEGY STATIC
//
// PROTOCOL: classic (STRATEGY range | cooperative-sticky) or consumer (KIP-848; STRATEGY is the
// server's assignor, group.remote.assignor).
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class Churn {
    static final AtomicBoolean stop = new AtomicBoolean();
    static final AtomicInteger started = new AtomicInteger();
    static final Map<String, AtomicLong> errors = new ConcurrentHashMap<>();

    static void count(String kind) {
        errors.computeIfAbsent(kind.replace(' ', '_'), k -> new AtomicLong()).incrementAndGet();
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], tag = args[1];
        int stages = Integer.parseInt(args[2]), workers = Integer.parseInt(args[3]);
        String protocol = args[4], strategy = args[5];
        boolean isStatic = Boolean.parseBoolean(args[6]);
        List<Thread> threads = new ArrayList<>();
        for (int s = 0; s < stages; s++) {
            for (int n = 0; n < workers; n++) {
                final int stage = s, slot = n;
                Thread t = new Thread(() -> {
                    while (!stop.get()) {
                        try {
                            member(bootstrap, tag, stage, slot, protocol, strategy, isStatic);
                        } catch (Exception e) {
                            count("member " + e.getClass().getSimpleName());
                        }
                    }
                });
                t.setDaemon(true);
                t.start();
                threads.add(t);
            }
        }
        while (System.in.read() != -1) {
            // run until the caller closes our stdin
        }
        stop.set(true);
        for (Thread t : threads) {
            t.join(60_000);
        }
        StringBuilder out = new StringBuilder("started=" + started.get());
        new TreeMap<>(errors).forEach((k, v) -> out.append(' ').append(k).append('=').append(v.get()));
        System.out.println(out);
        System.out.flush();
        System.exit(0);
    }

    static void member(String bootstrap, String tag, int stage, int slot, String protocol, String strategy,
                       boolean isStatic) {
        String src = "churn-" + tag + "-" + stage, dst = "churn-" + tag + "-" + (stage + 1);
        Properties c = new Properties();
        c.put("bootstrap.servers", bootstrap);
        c.put("group.id", src);
        c.put("enable.auto.commit", "false");
        c.put("auto.offset.reset", "earliest");
        c.put("key.deserializer", ByteArrayDeserializer.class.getName());
        c.put("value.deserializer", ByteArrayDeserializer.class.getName());
        if (protocol.equals("consumer")) {
            c.put("group.protocol", "consumer");
            c.put("group.remote.assignor", strategy);
        } else {
            c.put("partition.assignment.strategy", strategy.equals("range")
                ? "org.apache.kafka.clients.consumer.RangeAssignor"
                : "org.apache.kafka.clients.consumer.CooperativeStickyAssignor");
            c.put("session.timeout.ms", "6000");
            c.put("heartbeat.interval.ms", "500");
        }
        if (isStatic) {
            c.put("group.instance.id", tag + "-" + stage + "-" + slot);
        }
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("enable.idempotence", "true");
        p.put("compression.type", "snappy");
        p.put("linger.ms", "5");
        p.put("key.serializer", ByteArraySerializer.class.getName());
        p.put("value.serializer", ByteArraySerializer.class.getName());
        Map<Integer, Long> processed = new HashMap<>();
        try (KafkaProducer<byte[], byte[]> out = new KafkaProducer<>(p);
             KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(c)) {
            started.incrementAndGet();
            ConsumerRebalanceListener listener = new ConsumerRebalanceListener() {
                @Override
                public void onPartitionsRevoked(Collection<TopicPartition> parts) {
                    commit(consumer, out, processed, src, parts, true);
                }

                @Override
                public void onPartitionsAssigned(Collection<TopicPartition> parts) {
                }

                @Override
                public void onPartitionsLost(Collection<TopicPartition> parts) {
                    count("partitions lost");
                    for (TopicPartition tp : parts) {
                        processed.remove(tp.partition());
                    }
                }
            };
            consumer.subscribe(List.of(src), listener);
            long until = System.nanoTime() + (long) (ThreadLocalRandom.current().nextDouble(1.0, 3.0) * 1e9);
            long lastCommit = System.nanoTime();
            while (System.nanoTime() < until && !stop.get()) {
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(100))) {
                    out.send(new ProducerRecord<>(dst, r.key(), r.value()), (meta, e) -> {
                        if (e != null) {
                            count("delivery " + e.getClass().getSimpleName());
                        }
                    });
                    processed.put(r.partition(), r.offset() + 1);
                }
                if (System.nanoTime() - lastCommit > 1_000_000_000L) {
                    commit(consumer, out, processed, src, consumer.assignment(), false);
                    lastCommit = System.nanoTime();
                }
            }
            commit(consumer, out, processed, src, consumer.assignment(), false);
        } // close: the consumer revokes (committing) and leaves; the producer flushes
    }

    static void commit(KafkaConsumer<byte[], byte[]> consumer, KafkaProducer<byte[], byte[]> out,
                       Map<Integer, Long> processed, String src, Collection<TopicPartition> parts, boolean drop) {
        out.flush(); // what was produced is acked before its input is committed
        Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
        for (TopicPartition tp : parts) {
            Long next = processed.get(tp.partition());
            if (next != null) {
                offsets.put(new TopicPartition(src, tp.partition()), new OffsetAndMetadata(next));
            }
        }
        if (!offsets.isEmpty()) {
            try {
                consumer.commitSync(offsets);
            } catch (KafkaException e) {
                count("commit " + e.getClass().getSimpleName());
            }
        }
        if (drop) {
            for (TopicPartition tp : parts) {
                processed.remove(tp.partition());
            }
        }
    }
}

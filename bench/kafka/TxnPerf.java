import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Properties;
import java.util.Random;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Java's producer, transactional or not, for `seconds`: transactions of RECORDS_PER_TXN records of
 * SIZE bytes (each commitTransaction timed), or (TRANSACTIONAL_ID "-") an idempotent producer
 * (records sent RECORDS_PER_TXN at a time). Prints one JSON line: records, seconds, records_s and, when
 * transactional, the commit latencies' p50, p99 and mean in ms, and the mean time from beginTransaction to
 * commitTransaction (the sends: the client's own work, which no server time is in). Not transactional, it flushes once, at the end:
 * the producer's plain throughput.
 *
 * <p>Args: BOOTSTRAP TOPIC SIZE RECORDS_PER_TXN SECONDS TRANSACTIONAL_ID
 */
public class TxnPerf {
    public static void main(String[] args) {
        String bootstrap = args[0], topic = args[1], tid = args[5];
        int size = Integer.parseInt(args[2]), perTxn = Integer.parseInt(args[3]);
        double seconds = Double.parseDouble(args[4]);
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.put(ProducerConfig.LINGER_MS_CONFIG, 5);
        props.put(ProducerConfig.BATCH_SIZE_CONFIG, 1048576);
        props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, true);
        boolean txn = !tid.equals("-");
        if (txn) {
            props.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, tid);
        }
        byte[] value = new byte[size];
        new Random(1).nextBytes(value);
        List<Double> commits = new ArrayList<>();
        double sendsMs = 0;
        long records = 0;
        try (KafkaProducer<byte[], byte[]> producer =
                new KafkaProducer<>(props, new ByteArraySerializer(), new ByteArraySerializer())) {
            if (txn) {
                producer.initTransactions();
            }
            long start = System.nanoTime();
            while ((System.nanoTime() - start) / 1e9 < seconds || commits.size() < 3 && txn) {
                long begun = System.nanoTime();
                if (txn) {
                    producer.beginTransaction();
                }
                for (int i = 0; i < perTxn; i++) {
                    producer.send(new ProducerRecord<>(topic, value));
                }
                if (txn) {
                    long t0 = System.nanoTime();
                    sendsMs += (t0 - begun) / 1e6;
                    producer.commitTransaction();
                    commits.add((System.nanoTime() - t0) / 1e6);
                }
                records += perTxn;
            }
            producer.flush();
            double elapsed = (System.nanoTime() - start) / 1e9;
            Collections.sort(commits);
            StringBuilder out = new StringBuilder();
            out.append(String.format("{\"records\": %d, \"seconds\": %.3f, \"records_s\": %.1f", records, elapsed, records / elapsed));
            if (txn) {
                double sum = 0;
                for (double c : commits) {
                    sum += c;
                }
                out.append(String.format(", \"commit_p50_ms\": %.2f, \"commit_p99_ms\": %.2f, \"commit_mean_ms\": %.2f, \"sends_mean_ms\": %.2f",
                        commits.get(commits.size() / 2), commits.get(Math.min(commits.size() - 1, (int) (commits.size() * 0.99))),
                        sum / commits.size(), sendsMs / commits.size()));
            }
            System.out.println(out.append("}"));
        }
    }
}

import java.util.Properties;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * The Java client on its defaults (idempotent, acks=all, batch.size 16 KiB, linger.ms 5, five
 * requests in flight): sends COUNT records of SIZE bytes without keys, waits for every ack and
 * prints one JSON line. Arguments: bootstrap topic count size [key=value ...] (overrides).
 */
public class ProduceBench {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String topic = args[1];
        int count = Integer.parseInt(args[2]);
        byte[] value = new byte[Integer.parseInt(args[3])];
        new java.util.Random(7).nextBytes(value);
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        props.put("key.serializer", ByteArraySerializer.class.getName());
        props.put("value.serializer", ByteArraySerializer.class.getName());
        for (int i = 4; i < args.length; i++) {
            String[] kv = args[i].split("=", 2);
            props.put(kv[0], kv[1]);
        }
        AtomicLong errors = new AtomicLong();
        long[] latencies = new long[count];
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            producer.send(new ProducerRecord<>(topic, value)).get(); // metadata, producer id
            long began = System.nanoTime();
            for (int i = 0; i < count; i++) {
                final int index = i;
                final long sent = System.nanoTime();
                producer.send(new ProducerRecord<>(topic, value), (metadata, error) -> {
                    latencies[index] = System.nanoTime() - sent;
                    if (error != null) {
                        errors.incrementAndGet();
                    }
                });
            }
            producer.flush();
            double seconds = (System.nanoTime() - began) / 1e9;
            java.util.Arrays.sort(latencies);
            System.out.printf(
                "{\"records\": %d, \"seconds\": %.4f, \"errors\": %d, \"p50_ms\": %.2f, "
                    + "\"p99_ms\": %.2f}%n",
                count, seconds, errors.get(), latencies[count / 2] / 1e6,
                latencies[(int) (count * 0.99)] / 1e6);
        }
    }
}

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.Future;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Round trips of the official Java client, several in one JVM (a JVM start costs a test
 * seconds of CPU): "BOOTSTRAP PARTITIONS COUNT TIMEOUT_MS TOPIC:CODEC...". For each topic in
 * turn, what harness/java/ProxyClient.java's "produce" and "consume" do in a JVM each: COUNT
 * keyed records (idempotent, acks=all, compressed with CODEC) round-robin over the partitions,
 * printing "acked TOPIC PARTITION OFFSET" per record in send order; then a consumer group
 * ("java-TOPIC", incremental fetch sessions) reads them, printing
 * "record TOPIC PARTITION OFFSET KEY VALUE" per record until COUNT arrived or the time is up.
 */
public final class RoundTrips {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        int partitions = Integer.parseInt(args[1]);
        int count = Integer.parseInt(args[2]);
        long timeoutMs = Long.parseLong(args[3]);
        for (int i = 4; i < args.length; i++) {
            String[] topicCodec = args[i].split(":", 2);
            produce(bootstrap, topicCodec[0], partitions, count, topicCodec[1]);
            consume(bootstrap, topicCodec[0], "java-" + topicCodec[0], count, timeoutMs);
        }
    }

    static void produce(String bootstrap, String topic, int partitions, int count, String codec)
            throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        props.put("acks", "all");
        props.put("enable.idempotence", "true");
        props.put("compression.type", codec);
        props.put("linger.ms", "10");
        props.put("key.serializer", StringSerializer.class.getName());
        props.put("value.serializer", StringSerializer.class.getName());
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
            List<Future<RecordMetadata>> acks = new ArrayList<>();
            for (int i = 0; i < count; i++) {
                String value = ("java-" + i + "|").repeat(20);
                acks.add(producer.send(new ProducerRecord<>(topic, i % partitions, "key-" + i, value)));
            }
            producer.flush();
            for (Future<RecordMetadata> ack : acks) {
                RecordMetadata metadata = ack.get();
                System.out.println("acked " + topic + " " + metadata.partition() + " " + metadata.offset());
            }
        }
    }

    static void consume(String bootstrap, String topic, String group, int count, long timeoutMs) {
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        props.put("group.id", group);
        props.put("auto.offset.reset", "earliest");
        props.put("enable.auto.commit", "false");
        props.put("key.deserializer", StringDeserializer.class.getName());
        props.put("value.deserializer", StringDeserializer.class.getName());
        long deadline = System.currentTimeMillis() + timeoutMs;
        int seen = 0;
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props)) {
            consumer.subscribe(Collections.singletonList(topic));
            while (seen < count && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(200))) {
                    System.out.println("record " + topic + " " + r.partition() + " " + r.offset()
                            + " " + r.key() + " " + r.value());
                    seen++;
                }
                consumer.commitSync();
            }
        }
    }
}

import java.io.FileReader;
import java.io.IOException;
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
 * The official Java client, for the tests: "produce BOOTSTRAP TOPIC PARTITIONS COUNT CODEC"
 * sends COUNT keyed records (idempotent, acks=all) round-robin over the partitions and prints
 * "acked PARTITION OFFSET" per record; "consume BOOTSTRAP TOPIC GROUP COUNT TIMEOUT_MS" reads
 * with a consumer group (incremental fetch sessions, as the Java client always fetches) and
 * prints "record PARTITION OFFSET KEY VALUE" per record until COUNT arrived or the time is up.
 * "round-trips BOOTSTRAP PARTITIONS COUNT TIMEOUT_MS TOPIC:CODEC..." does both for each topic in
 * turn in this one JVM (a JVM start costs a test seconds of CPU), with the group "java-TOPIC",
 * and names the topic in each line ("acked TOPIC PARTITION OFFSET", "record TOPIC PARTITION ...").
 * A properties file named by $CLIENT_PROPERTIES (security settings) is added to all.
 */
public final class ProxyClient {
    public static void main(String[] args) throws Exception {
        if (args[0].equals("produce")) {
            produce(args[1], args[2], Integer.parseInt(args[3]), Integer.parseInt(args[4]), args[5], "");
        } else if (args[0].equals("consume")) {
            consume(args[1], args[2], args[3], Integer.parseInt(args[4]), Long.parseLong(args[5]), "");
        } else {
            roundTrips(args);
        }
    }

    static void roundTrips(String[] args) throws Exception {
        String bootstrap = args[1];
        int partitions = Integer.parseInt(args[2]);
        int count = Integer.parseInt(args[3]);
        long timeoutMs = Long.parseLong(args[4]);
        for (int i = 5; i < args.length; i++) {
            String[] topicCodec = args[i].split(":", 2);
            String topic = topicCodec[0];
            produce(bootstrap, topic, partitions, count, topicCodec[1], topic + " ");
            consume(bootstrap, topic, "java-" + topic, count, timeoutMs, topic + " ");
        }
    }

    static Properties base() throws IOException {
        Properties props = new Properties();
        String extra = System.getenv("CLIENT_PROPERTIES");
        if (extra != null) {
            try (FileReader reader = new FileReader(extra)) {
                props.load(reader);
            }
        }
        return props;
    }

    static void produce(
            String bootstrap, String topic, int partitions, int count, String codec, String label)
            throws Exception {
        Properties props = base();
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
                System.out.println("acked " + label + metadata.partition() + " " + metadata.offset());
            }
        }
    }

    static void consume(
            String bootstrap, String topic, String group, int count, long timeoutMs, String label)
            throws IOException {
        Properties props = base();
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
                    System.out.println(
                            "record " + label + r.partition() + " " + r.offset() + " " + r.key() + " "
                                    + r.value());
                    seen++;
                }
                consumer.commitSync();
            }
        }
    }
}

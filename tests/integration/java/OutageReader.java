import java.time.Duration;
import java.util.Collections;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;

/**
 * Reads one partition from its start, as an application's poll loop does, until it has read
 * COUNT records: "OutageReader BOOTSTRAP TOPIC PARTITION COUNT TIMEOUT_MS". Prints "record
 * OFFSET VALUE" per record and "done" at the end (exit 0); an exception out of poll() is
 * printed as "error CLASS: MESSAGE" (exit 2), which is what an application would have died of;
 * "timeout" (exit 1) if COUNT records were not read within TIMEOUT_MS.
 */
public class OutageReader {
    public static void main(String[] args) {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("key.deserializer", StringDeserializer.class.getName());
        props.put("value.deserializer", StringDeserializer.class.getName());
        props.put("enable.auto.commit", "false");
        TopicPartition tp = new TopicPartition(args[1], Integer.parseInt(args[2]));
        int count = Integer.parseInt(args[3]);
        long deadline = System.currentTimeMillis() + Long.parseLong(args[4]);
        int read = 0;
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props)) {
            consumer.assign(Collections.singletonList(tp));
            consumer.seekToBeginning(Collections.singletonList(tp));
            while (read < count && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(200))) {
                    System.out.println("record " + r.offset() + " " + r.value());
                    read++;
                }
                System.out.flush();
            }
        } catch (Exception e) {
            System.out.println("error " + e.getClass().getName() + ": " + e.getMessage());
            System.out.flush();
            System.exit(2);
        }
        System.out.println(read >= count ? "done" : "timeout");
        System.out.flush();
        System.exit(read >= count ? 0 : 1);
    }
}

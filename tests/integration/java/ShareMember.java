import java.time.Duration;
import java.util.Collections;
import java.util.Properties;

import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.common.serialization.StringDeserializer;

/**
 * One member of a share group (KIP-932) for the share group tests:
 * "ShareMember BOOTSTRAP GROUP TOPIC MODE IDLE_MS" where MODE is "accept" (every record is
 * accepted) or "release-once" (a record delivered the first time is released, later accepted).
 * Acknowledges explicitly and commits after each poll; prints "record VALUE OFFSET COUNT" per
 * record and "done" when no record came for IDLE_MS after the first one (or 60 s in all).
 */
public class ShareMember {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("group.id", args[1]);
        props.put("share.acknowledgement.mode", "explicit");
        props.put("key.deserializer", StringDeserializer.class.getName());
        props.put("value.deserializer", StringDeserializer.class.getName());
        boolean releaseOnce = args[3].equals("release-once");
        long idleMs = Long.parseLong(args[4]);
        long started = System.currentTimeMillis();
        long last = -1;
        try (KafkaShareConsumer<String, String> consumer = new KafkaShareConsumer<>(props)) {
            consumer.subscribe(Collections.singletonList(args[2]));
            while (System.currentTimeMillis() - started < 60_000) {
                var records = consumer.poll(Duration.ofMillis(200));
                for (ConsumerRecord<String, String> record : records) {
                    short count = record.deliveryCount().orElse((short) -1);
                    System.out.println("record " + record.value() + " " + record.offset() + " " + count);
                    boolean release = releaseOnce && count == 1;
                    consumer.acknowledge(record, release ? AcknowledgeType.RELEASE : AcknowledgeType.ACCEPT);
                }
                if (!records.isEmpty()) {
                    consumer.commitSync();
                    last = System.currentTimeMillis();
                }
                if (last > 0 && System.currentTimeMillis() - last > idleMs) {
                    break;
                }
            }
        }
        System.out.println("done");
        System.out.flush();
    }
}

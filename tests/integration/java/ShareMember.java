import java.io.InputStream;
import java.time.Duration;
import java.util.Collections;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicBoolean;

import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.common.serialization.StringDeserializer;

/**
 * One member of a share group (KIP-932) for the share group tests:
 * "ShareMember BOOTSTRAP GROUP TOPIC MODE" where MODE is "accept" (every record is accepted) or
 * "release-once" (a record delivered the first time is released, later accepted).
 * Acknowledges explicitly and commits after each poll; prints "record VALUE OFFSET COUNT" per
 * record (flushed at once) and "done" after closing the consumer. It polls until its standard
 * input ends (the test closes it once the members together printed every delivery it expects:
 * a member that gets no record, as one of two on one partition may, does not wait out an idle
 * time), or 120 s in all.
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
        AtomicBoolean stop = new AtomicBoolean(false);
        Thread stdin = new Thread(() -> {
            try {
                InputStream in = System.in;
                while (in.read() != -1) {
                    // the test only ever closes it
                }
            } catch (Exception e) {
                // closed or broken: stop either way
            }
            stop.set(true);
        });
        stdin.setDaemon(true);
        stdin.start();
        long started = System.currentTimeMillis();
        try (KafkaShareConsumer<String, String> consumer = new KafkaShareConsumer<>(props)) {
            consumer.subscribe(Collections.singletonList(args[2]));
            while (!stop.get() && System.currentTimeMillis() - started < 120_000) {
                var records = consumer.poll(Duration.ofMillis(200));
                for (ConsumerRecord<String, String> record : records) {
                    short count = record.deliveryCount().orElse((short) -1);
                    System.out.println("record " + record.value() + " " + record.offset() + " " + count);
                    boolean release = releaseOnce && count == 1;
                    consumer.acknowledge(record, release ? AcknowledgeType.RELEASE : AcknowledgeType.ACCEPT);
                }
                if (!records.isEmpty()) {
                    consumer.commitSync();
                    System.out.flush();
                }
            }
        }
        System.out.println("done");
        System.out.flush();
    }
}

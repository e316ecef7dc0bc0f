import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.time.Duration;
import java.util.Collection;
import java.util.Collections;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.stream.Collectors;

import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;

/**
 * One consumer group member for the KIP-848 tests: "GroupMember BOOTSTRAP TOPIC GROUP PROTOCOL"
 * (PROTOCOL: consumer or classic) consumes until a line arrives on stdin (or stdin closes),
 * committing synchronously after each poll, and prints one line per event with the wall clock
 * in ms: "assigned T p,p", "revoked T p,p", "lost T p,p", "record T PARTITION OFFSET VALUE",
 * "committed T" and finally "closed T".
 */
public class GroupMember {
    static synchronized void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    static String parts(Collection<TopicPartition> partitions) {
        return partitions.stream().map(tp -> Integer.toString(tp.partition())).sorted()
            .collect(Collectors.joining(","));
    }

    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("group.id", args[2]);
        props.put("group.protocol", args[3]);
        props.put("enable.auto.commit", "false");
        props.put("auto.offset.reset", "earliest");
        props.put("key.deserializer", StringDeserializer.class.getName());
        props.put("value.deserializer", StringDeserializer.class.getName());
        if (args[3].equals("classic")) {
            props.put("session.timeout.ms", "6000");
            props.put("heartbeat.interval.ms", "500");
        }
        AtomicBoolean stop = new AtomicBoolean(false);
        Thread watcher = new Thread(() -> {
            try {
                new BufferedReader(new InputStreamReader(System.in)).readLine();
            } catch (Exception e) {
                // stdin gone: stop as well
            }
            stop.set(true);
        });
        watcher.setDaemon(true);
        watcher.start();
        try {
            try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props)) {
                consumer.subscribe(Collections.singletonList(args[1]), new ConsumerRebalanceListener() {
                    public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
                        if (!partitions.isEmpty()) {
                            consumer.commitSync();
                            say("revoked " + System.currentTimeMillis() + " " + parts(partitions));
                        }
                    }

                    public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
                        if (!partitions.isEmpty()) {
                            say("assigned " + System.currentTimeMillis() + " " + parts(partitions));
                        }
                    }

                    public void onPartitionsLost(Collection<TopicPartition> partitions) {
                        if (!partitions.isEmpty()) {
                            say("lost " + System.currentTimeMillis() + " " + parts(partitions));
                        }
                    }
                });
                while (!stop.get()) {
                    boolean any = false;
                    for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(100))) {
                        say("record " + System.currentTimeMillis() + " " + r.partition() + " "
                            + r.offset() + " " + r.value());
                        any = true;
                    }
                    if (any) {
                        try {
                            consumer.commitSync();
                            say("committed " + System.currentTimeMillis());
                        } catch (Exception e) {
                            say("commit-failed " + System.currentTimeMillis() + " " + e);
                        }
                    }
                }
            }
        } catch (RuntimeException e) {
            // A close whose revocation commit failed still ends this member's ownership: it
            // is gone once it exits, so "closed" below marks the end either way.
            say("close-failed " + System.currentTimeMillis() + " " + e);
        } finally {
            say("closed " + System.currentTimeMillis());
        }
    }
}

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.stream.Collectors;

import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;

/**
 * Consumer group members for the KIP-848 tests, any number in one JVM (a JVM start is ~2.5 s
 * of CPU; a test runs up to eight members), each its own KafkaConsumer on its own thread.
 * Commands on stdin, one a line:
 *
 *   start NAME BOOTSTRAP TOPIC GROUP PROTOCOL   (PROTOCOL: consumer or classic)
 *   stop NAME
 *
 * A member consumes until stopped (or stdin closes), committing synchronously after each poll,
 * and prints one line per event, its name first, with the wall clock in ms: "NAME assigned T
 * p,p", "NAME revoked T p,p", "NAME lost T p,p", "NAME record T PARTITION OFFSET VALUE",
 * "NAME committed T" and finally "NAME closed T".
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
        Map<String, AtomicBoolean> stops = new ConcurrentHashMap<>();
        List<Thread> members = new ArrayList<>();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        for (String line = in.readLine(); line != null; line = in.readLine()) {
            String[] words = line.split(" ");
            if (words[0].equals("start")) {
                AtomicBoolean stop = new AtomicBoolean(false);
                stops.put(words[1], stop);
                Thread member = new Thread(
                    () -> run(words[1], words[2], words[3], words[4], words[5], stop));
                member.start();
                members.add(member);
            } else if (words[0].equals("stop")) {
                stops.get(words[1]).set(true);
            }
        }
        for (AtomicBoolean stop : stops.values()) {  // stdin gone: everyone stops
            stop.set(true);
        }
        for (Thread member : members) {
            member.join();
        }
    }

    static void run(String name, String bootstrap, String topic, String group, String protocol,
                    AtomicBoolean stop) {
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        props.put("group.id", group);
        props.put("group.protocol", protocol);
        props.put("enable.auto.commit", "false");
        props.put("auto.offset.reset", "earliest");
        props.put("key.deserializer", StringDeserializer.class.getName());
        props.put("value.deserializer", StringDeserializer.class.getName());
        if (protocol.equals("classic")) {
            props.put("session.timeout.ms", "6000");
            props.put("heartbeat.interval.ms", "500");
        }
        try {
            try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props)) {
                consumer.subscribe(Collections.singletonList(topic), new ConsumerRebalanceListener() {
                    public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
                        if (!partitions.isEmpty()) {
                            consumer.commitSync();
                            say(name + " revoked " + System.currentTimeMillis() + " " + parts(partitions));
                        }
                    }

                    public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
                        if (!partitions.isEmpty()) {
                            say(name + " assigned " + System.currentTimeMillis() + " " + parts(partitions));
                        }
                    }

                    public void onPartitionsLost(Collection<TopicPartition> partitions) {
                        if (!partitions.isEmpty()) {
                            say(name + " lost " + System.currentTimeMillis() + " " + parts(partitions));
                        }
                    }
                });
                while (!stop.get()) {
                    boolean any = false;
                    for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(100))) {
                        say(name + " record " + System.currentTimeMillis() + " " + r.partition() + " "
                            + r.offset() + " " + r.value());
                        any = true;
                    }
                    if (any) {
                        try {
                            consumer.commitSync();
                            say(name + " committed " + System.currentTimeMillis());
                        } catch (Exception e) {
                            say(name + " commit-failed " + System.currentTimeMillis() + " " + e);
                        }
                    }
                }
            }
        } catch (RuntimeException e) {
            // A close whose revocation commit failed still ends this member's ownership: it
            // is gone once it stops, so "closed" below marks the end either way.
            say(name + " close-failed " + System.currentTimeMillis() + " " + e);
        } finally {
            say(name + " closed " + System.currentTimeMillis());
        }
    }
}

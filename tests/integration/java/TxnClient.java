import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * The official Java client's transactions, for the tests.
 * "rounds BOOTSTRAP TOPIC PARTITIONS TXN_ID ROUNDS": one transaction of 10 records per round,
 * committed in even rounds and aborted in odd ones; prints "committed R" or "aborted R".
 * "zombie BOOTSTRAP TOPIC TXN_ID": a producer begins a transaction, a second one with the same
 * transactional id initialises, then the first tries to commit; prints "fenced CLASS" or "committed".
 * "read BOOTSTRAP TOPIC PARTITIONS EXPECT": read_committed from the start; prints
 * "record PARTITION VALUE" until EXPECT records arrived and a quiet second passed.
 * "describe BOOTSTRAP TXN_ID": DescribeTransactions through the Admin client; prints
 * "STATE PRODUCER_ID PRODUCER_EPOCH".
 * "offsets BOOTSTRAP TOPIC TXN_ID GROUP ROUNDS": per round a transaction with one record and
 * the group's offset of TOPIC-0 set to the round (sendOffsetsToTransaction), committed in even
 * rounds and aborted in odd ones; then prints the group's committed offset "offset N".
 * "serve": such calls from stdin, one a line with tab-separated arguments, each answered by its
 * output and "end 0" (or "end 1" when it threw): tests/harness/java_session.py, one JVM for a
 * module's calls.
 */
public final class TxnClient {
    public static void main(String[] args) throws Exception {
        if (args.length == 1 && args[0].equals("serve")) {
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
            for (String line = in.readLine(); line != null; line = in.readLine()) {
                int code = 0;
                try {
                    run(line.split("\t"));
                } catch (Exception e) {
                    e.printStackTrace();
                    code = 1;
                }
                System.out.println("end " + code);
                System.out.flush();
            }
            return;
        }
        run(args);
    }

    static void run(String[] args) throws Exception {
        switch (args[0]) {
            case "rounds" -> rounds(args[1], args[2], Integer.parseInt(args[3]), args[4], Integer.parseInt(args[5]));
            case "zombie" -> zombie(args[1], args[2], args[3]);
            case "describe" -> describe(args[1], args[2]);
            case "offsets" -> offsets(args[1], args[2], args[3], args[4], Integer.parseInt(args[5]));
            default -> read(args[1], args[2], Integer.parseInt(args[3]), Integer.parseInt(args[4]));
        }
    }

    static KafkaProducer<String, String> producer(String bootstrap, String txnId) {
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        props.put("transactional.id", txnId);
        props.put("transaction.timeout.ms", "30000");
        props.put("linger.ms", "5");
        props.put("key.serializer", StringSerializer.class.getName());
        props.put("value.serializer", StringSerializer.class.getName());
        KafkaProducer<String, String> producer = new KafkaProducer<>(props);
        producer.initTransactions();
        return producer;
    }

    static void rounds(String bootstrap, String topic, int partitions, String txnId, int rounds) {
        try (KafkaProducer<String, String> producer = producer(bootstrap, txnId)) {
            for (int round = 0; round < rounds; round++) {
                producer.beginTransaction();
                for (int i = 0; i < 10; i++) {
                    producer.send(new ProducerRecord<>(topic, i % partitions, null, round + "-" + i));
                }
                if (round % 2 == 0) {
                    producer.commitTransaction();
                    System.out.println("committed " + round);
                } else {
                    producer.flush();
                    producer.abortTransaction();
                    System.out.println("aborted " + round);
                }
            }
        }
    }

    static void zombie(String bootstrap, String topic, String txnId) {
        KafkaProducer<String, String> zombie = producer(bootstrap, txnId);
        zombie.beginTransaction();
        zombie.send(new ProducerRecord<>(topic, 0, null, "from-the-zombie"));
        zombie.flush();
        try (KafkaProducer<String, String> successor = producer(bootstrap, txnId)) {
            successor.beginTransaction();
            successor.send(new ProducerRecord<>(topic, 0, null, "from-the-successor"));
            successor.commitTransaction();
        }
        try {
            zombie.send(new ProducerRecord<>(topic, 0, null, "late"));
            zombie.commitTransaction();
            System.out.println("committed");
        } catch (Exception e) {
            Throwable cause = e;
            while (cause.getCause() != null && !cause.getClass().getSimpleName().contains("Fenced")
                    && !cause.getClass().getSimpleName().contains("Epoch")) {
                cause = cause.getCause();
            }
            System.out.println("fenced " + cause.getClass().getSimpleName());
        } finally {
            zombie.close(Duration.ofSeconds(5));
        }
    }

    static void describe(String bootstrap, String txnId) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        try (Admin admin = Admin.create(props)) {
            TransactionDescription d = admin.describeTransactions(List.of(txnId)).description(txnId).get();
            System.out.println(d.state() + " " + d.producerId() + " " + d.producerEpoch());
        }
    }

    static void offsets(String bootstrap, String topic, String txnId, String group, int rounds)
            throws Exception {
        TopicPartition tp = new TopicPartition(topic, 0);
        try (KafkaProducer<String, String> producer = producer(bootstrap, txnId)) {
            for (int round = 0; round < rounds; round++) {
                producer.beginTransaction();
                producer.send(new ProducerRecord<>(topic, 0, null, "r" + round));
                producer.sendOffsetsToTransaction(
                        Map.of(tp, new OffsetAndMetadata(round)), new ConsumerGroupMetadata(group));
                if (round % 2 == 0) {
                    producer.commitTransaction();
                } else {
                    producer.abortTransaction();
                }
            }
        }
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        try (Admin admin = Admin.create(props)) {
            OffsetAndMetadata committed =
                    admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get().get(tp);
            System.out.println("offset " + (committed == null ? -1 : committed.offset()));
        }
    }

    static void read(String bootstrap, String topic, int partitions, int expect) {
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        props.put("isolation.level", "read_committed");
        props.put("enable.auto.commit", "false");
        props.put("key.deserializer", StringDeserializer.class.getName());
        props.put("value.deserializer", StringDeserializer.class.getName());
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props)) {
            List<TopicPartition> assigned = new ArrayList<>();
            for (int p = 0; p < partitions; p++) {
                assigned.add(new TopicPartition(topic, p));
            }
            consumer.assign(assigned);
            consumer.seekToBeginning(assigned);
            int seen = 0;
            long deadline = System.currentTimeMillis() + 30000;
            long quietUntil = Long.MAX_VALUE;
            while (System.currentTimeMillis() < Math.min(deadline, quietUntil)) {
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(200))) {
                    System.out.println("record " + r.partition() + " " + r.value());
                    seen++;
                }
                if (seen >= expect && quietUntil == Long.MAX_VALUE) {
                    quietUntil = System.currentTimeMillis() + 1000;
                }
            }
        }
    }
}

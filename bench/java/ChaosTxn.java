import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.time.Duration;
import java.util.Properties;
import java.util.Random;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.errors.TimeoutException;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * bench/chaos_txn.py's Java transactional producer (kafka-clients 4.x: transaction protocol v2,
 * so Produce v12 adds partitions implicitly and EndTxn v5 bumps the epoch at every end).
 *
 * "ChaosTxn BOOTSTRAP TOPIC PARTITIONS TXN_ID PER_TXN ABORT_SHARE SEED": transactions of PER_TXN
 * records over the topic's partitions, ABORT_SHARE of them aborted on purpose, until stdin
 * closes. Prints, for the campaign's journal, before each record is sent "rec N PARTITION VALUE"
 * and when transaction N ended "end N OUTCOME [ERROR]" (committed, aborted, commit_failed,
 * indeterminate: see chaos_txn.py), and "error WHAT" for each failure it met.
 */
public final class ChaosTxn {
    static volatile boolean stop = false;

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String topic = args[1];
        int partitions = Integer.parseInt(args[2]);
        String txnId = args[3];
        int perTxn = Integer.parseInt(args[4]);
        double abortShare = Double.parseDouble(args[5]);
        Random rng = new Random(Long.parseLong(args[6]));
        Thread stdin = new Thread(() -> {
            try (BufferedReader in = new BufferedReader(new InputStreamReader(System.in))) {
                while (in.readLine() != null) { }
            } catch (Exception e) { }
            stop = true;
        });
        stdin.setDaemon(true);
        stdin.start();
        KafkaProducer<String, String> producer = null;
        for (int n = 0; !stop; n++) {
            if (producer == null) {
                producer = init(bootstrap, txnId);
                if (producer == null) {
                    break;
                }
            }
            if (!transaction(producer, topic, partitions, txnId, perTxn, n, rng.nextDouble() >= abortShare)) {
                close(producer);
                producer = null;
            }
            Thread.sleep(50);
        }
        if (producer != null) {
            close(producer);
        }
        System.out.flush();
    }

    static KafkaProducer<String, String> init(String bootstrap, String txnId) throws Exception {
        while (!stop) {
            Properties props = new Properties();
            props.put("bootstrap.servers", bootstrap);
            props.put("transactional.id", txnId);
            props.put("transaction.timeout.ms", "20000");
            props.put("request.timeout.ms", "10000");
            props.put("delivery.timeout.ms", "20000");
            props.put("max.block.ms", "30000");
            props.put("linger.ms", "5");
            props.put("key.serializer", StringSerializer.class.getName());
            props.put("value.serializer", StringSerializer.class.getName());
            KafkaProducer<String, String> producer = new KafkaProducer<>(props);
            try {
                producer.initTransactions();
                return producer;
            } catch (Exception e) {
                report("init", e);
                close(producer);
                Thread.sleep(500);
            }
        }
        return null;
    }

    /** One transaction; false if the producer must be replaced. */
    static boolean transaction(
            KafkaProducer<String, String> producer, String topic, int partitions, String txnId,
            int perTxn, int n, boolean commit) {
        try {
            producer.beginTransaction();
            for (int k = 0; k < perTxn; k++) {
                int partition = (txnId.hashCode() + n + k) % partitions;
                partition = partition < 0 ? partition + partitions : partition;
                String value = txnId + "-" + n + "-" + k;
                System.out.println("rec " + n + " " + partition + " " + value);
                producer.send(new ProducerRecord<>(topic, partition, null, value));
            }
        } catch (Exception e) {
            report("produce", e);
            return abort(producer, n, "aborted");
        }
        if (!commit) {
            return abort(producer, n, "aborted");
        }
        for (int attempt = 0; attempt < 10; attempt++) {
            try {
                producer.commitTransaction();
                end(n, "committed");
                return true;
            } catch (TimeoutException e) {
                report("commit", e);
            } catch (Exception e) {
                report("commit", e);
                return abort(producer, n, "commit_failed");
            }
        }
        end(n, "indeterminate");
        return false;
    }

    /** Abort; a transaction never asked to commit stays "aborted" even if the abort fails. */
    static boolean abort(KafkaProducer<String, String> producer, int n, String outcome) {
        for (int attempt = 0; attempt < 10; attempt++) {
            try {
                producer.abortTransaction();
                end(n, outcome);
                return true;
            } catch (TimeoutException e) {
                report("abort", e);
            } catch (Exception e) {
                report("abort", e);
                break;
            }
        }
        end(n, outcome.equals("aborted") ? "aborted" : "indeterminate");
        return false;
    }

    static void end(int n, String outcome) {
        System.out.println("end " + n + " " + outcome);
        System.out.flush();
    }

    static void report(String what, Exception e) {
        System.out.println("error " + what + " " + e.getClass().getSimpleName());
        System.out.flush();
    }

    static void close(KafkaProducer<String, String> producer) {
        try {
            producer.close(Duration.ofSeconds(5));
        } catch (Exception e) { }
    }
}

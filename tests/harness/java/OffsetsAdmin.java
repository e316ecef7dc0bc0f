import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ExecutionException;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.DeleteConsumerGroupOffsetsResult;
import org.apache.kafka.clients.admin.LogDirDescription;
import org.apache.kafka.clients.admin.ReplicaInfo;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionReplica;

/**
 * The Java AdminClient's calls behind kafka-consumer-groups.sh --delete-offsets and
 * kafka-log-dirs.sh --describe, against a broker or a proxy.
 *
 * delete BOOTSTRAP GROUP TOPIC P...: deleteConsumerGroupOffsets; one line per partition,
 * "ok TOPIC P" or "error TOPIC P ExceptionClass", or one "error ExceptionClass" for the group.
 * logdirs BOOTSTRAP: describeLogDirs of every broker DescribeCluster names; per broker and dir
 * "dir BROKER PATH ERROR TOTAL USABLE" (ERROR "none", TOTAL/USABLE -1 when not given), then per
 * replica "replica BROKER TOPIC P SIZE LAG FUTURE".
 * alterdir BOOTSTRAP BROKER DIR TOPIC P...: alterReplicaLogDirs (kafka-reassign-partitions.sh
 * with log dirs) of the replicas on BROKER to DIR; one line per partition, "ok TOPIC P" or
 * "error TOPIC P ExceptionClass".
 */
public class OffsetsAdmin {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[1]);
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        try (Admin admin = Admin.create(props)) {
            if (args[0].equals("delete")) {
                delete(admin, args[2], args[3], args);
            } else if (args[0].equals("alterdir")) {
                alterDir(admin, Integer.parseInt(args[2]), args[3], args[4], args);
            } else {
                logDirs(admin);
            }
        }
    }

    private static void delete(Admin admin, String group, String topic, String[] args)
            throws InterruptedException {
        Set<TopicPartition> partitions = new HashSet<>();
        for (int i = 4; i < args.length; i++) {
            partitions.add(new TopicPartition(topic, Integer.parseInt(args[i])));
        }
        DeleteConsumerGroupOffsetsResult result = admin.deleteConsumerGroupOffsets(group, partitions);
        List<String> lines = new ArrayList<>();
        for (int i = 4; i < args.length; i++) {
            TopicPartition tp = new TopicPartition(topic, Integer.parseInt(args[i]));
            try {
                result.partitionResult(tp).get();
                lines.add("ok " + topic + " " + tp.partition());
            } catch (ExecutionException e) {
                String name = e.getCause().getClass().getSimpleName();
                try {
                    result.all().get();
                } catch (ExecutionException whole) {
                    if (isGroupLevel(whole.getCause().getClass().getSimpleName())) {
                        System.out.println("error " + whole.getCause().getClass().getSimpleName());
                        return;
                    }
                }
                lines.add("error " + topic + " " + tp.partition() + " " + name);
            }
        }
        lines.forEach(System.out::println);
    }

    private static void alterDir(Admin admin, int broker, String dir, String topic, String[] args)
            throws InterruptedException {
        Map<TopicPartitionReplica, String> moves = new HashMap<>();
        for (int i = 5; i < args.length; i++) {
            moves.put(new TopicPartitionReplica(topic, Integer.parseInt(args[i]), broker), dir);
        }
        Map<TopicPartitionReplica, org.apache.kafka.common.KafkaFuture<Void>> results =
            admin.alterReplicaLogDirs(moves).values();
        for (int i = 5; i < args.length; i++) {
            TopicPartitionReplica replica =
                new TopicPartitionReplica(topic, Integer.parseInt(args[i]), broker);
            try {
                results.get(replica).get();
                System.out.println("ok " + topic + " " + args[i]);
            } catch (ExecutionException e) {
                System.out.println("error " + topic + " " + args[i] + " "
                    + e.getCause().getClass().getSimpleName());
            }
        }
    }

    private static boolean isGroupLevel(String exception) {
        return exception.equals("GroupIdNotFoundException")
            || exception.equals("GroupNotEmptyException")
            || exception.equals("GroupAuthorizationException")
            || exception.equals("InvalidGroupIdException");
    }

    private static void logDirs(Admin admin) throws Exception {
        List<Integer> ids = new ArrayList<>();
        for (Node node : admin.describeCluster().nodes().get()) {
            ids.add(node.id());
        }
        Map<Integer, Map<String, LogDirDescription>> all =
            new TreeMap<>(admin.describeLogDirs(ids).allDescriptions().get());
        for (Map.Entry<Integer, Map<String, LogDirDescription>> broker : all.entrySet()) {
            for (Map.Entry<String, LogDirDescription> dir : broker.getValue().entrySet()) {
                LogDirDescription d = dir.getValue();
                String error = d.error() == null ? "none" : d.error().getClass().getSimpleName();
                System.out.println("dir " + broker.getKey() + " " + dir.getKey() + " " + error + " "
                    + d.totalBytes().orElse(-1) + " " + d.usableBytes().orElse(-1));
                Map<String, ReplicaInfo> sorted = new TreeMap<>();
                for (Map.Entry<TopicPartition, ReplicaInfo> r : d.replicaInfos().entrySet()) {
                    sorted.put(r.getKey().topic() + " " + r.getKey().partition(), r.getValue());
                }
                for (Map.Entry<String, ReplicaInfo> r : sorted.entrySet()) {
                    ReplicaInfo info = r.getValue();
                    System.out.println("replica " + broker.getKey() + " " + r.getKey() + " "
                        + info.size() + " " + info.offsetLag() + " " + info.isFuture());
                }
            }
        }
    }
}

import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ExecutionException;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterPartitionReassignmentsOptions;
import org.apache.kafka.clients.admin.NewPartitionReassignment;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.ElectionType;
import org.apache.kafka.common.KafkaFuture;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.config.ConfigResource;

/**
 * The Java AdminClient's replica calls (what kafka-topics.sh --describe,
 * kafka-leader-election.sh and kafka-reassign-partitions.sh use) on the topic args[1]:
 * describe it, elect preferred leaders, reassign partition 0 to its leader, to its leader
 * plus another broker without a replication factor change, cancel, list reassignments, list
 * config resources. One line per step; an exception's class is printed, not thrown.
 */
public class ReplicaAdmin {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        String topic = args[1];
        try (Admin admin = Admin.create(props)) {
            TopicDescription description = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
            Set<TopicPartition> partitions = new HashSet<>();
            for (TopicPartitionInfo p : description.partitions()) {
                partitions.add(new TopicPartition(topic, p.partition()));
                System.out.println("partition " + p.partition() + " leader " + id(p.leader())
                    + " replicas " + ids(p.replicas()) + " isr " + ids(p.isr()));
            }
            Map<TopicPartition, Optional<Throwable>> elected =
                admin.electLeaders(ElectionType.PREFERRED, partitions).partitions().get();
            for (Map.Entry<TopicPartition, Optional<Throwable>> e : elected.entrySet()) {
                System.out.println("elect " + e.getKey().partition() + " "
                    + e.getValue().map(t -> t.getClass().getSimpleName()).orElse("none"));
            }
            TopicPartition first = new TopicPartition(topic, 0);
            int leader = description.partitions().get(0).leader().id();
            System.out.println("reassign " + outcome(admin.alterPartitionReassignments(
                Map.of(first, Optional.of(new NewPartitionReassignment(List.of(leader))))).all()));
            List<Integer> wider = new ArrayList<>(List.of(leader));
            for (Node node : admin.describeCluster().nodes().get()) {
                if (node.id() != leader) {
                    wider.add(node.id());
                    break;
                }
            }
            System.out.println("widen " + outcome(admin.alterPartitionReassignments(
                Map.of(first, Optional.of(new NewPartitionReassignment(wider))),
                new AlterPartitionReassignmentsOptions().allowReplicationFactorChange(false)).all()));
            Map<TopicPartition, Optional<NewPartitionReassignment>> cancel = new HashMap<>();
            cancel.put(first, Optional.empty());
            System.out.println("cancel " + outcome(admin.alterPartitionReassignments(cancel).all()));
            System.out.println("ongoing " + admin.listPartitionReassignments().reassignments().get().size());
            Collection<ConfigResource> resources = admin.listConfigResources().all().get();
            for (ConfigResource r : resources) {
                if (r.type() != ConfigResource.Type.TOPIC || r.name().equals(topic)) {
                    System.out.println("resource " + r.type() + " " + r.name());
                }
            }
        } catch (Exception e) {
            Throwable cause = e.getCause() != null ? e.getCause() : e;
            System.out.println("error " + cause.getClass().getSimpleName() + " " + cause.getMessage());
            System.exit(1);
        }
    }

    private static String outcome(KafkaFuture<Void> future) throws InterruptedException {
        try {
            future.get();
            return "none";
        } catch (ExecutionException e) {
            return e.getCause().getClass().getSimpleName();
        }
    }

    private static String id(Node node) {
        return node == null ? "-1" : Integer.toString(node.id());
    }

    private static String ids(List<Node> nodes) {
        List<String> out = new ArrayList<>();
        for (Node n : nodes) {
            out.add(Integer.toString(n.id()));
        }
        return String.join(",", out);
    }
}

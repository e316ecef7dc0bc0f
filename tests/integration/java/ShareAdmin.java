import java.util.Collections;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.Set;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ListShareGroupOffsetsSpec;
import org.apache.kafka.clients.admin.ShareGroupDescription;
import org.apache.kafka.clients.admin.SharePartitionOffsetInfo;
import org.apache.kafka.common.TopicPartition;

/**
 * The Java Admin client's share group calls (what kafka-share-groups.sh uses), several in one
 * JVM (a JVM start costs seconds of CPU): "ShareAdmin STEP...", each STEP
 * "describe|offsets|alter|delete-offsets|delete,BOOTSTRAP,GROUP[,TOPIC[,P,OFFSET]]", run in
 * order, one Admin client per bootstrap. Each step prints "group STATE MEMBERS EPOCH" or
 * "offset TOPIC P START LAG" lines, then "done", or "error EXCEPTION MESSAGE"; later steps run
 * either way.
 */
public class ShareAdmin {
    public static void main(String[] args) throws Exception {
        Map<String, Admin> admins = new HashMap<>();
        try {
            for (String step : args) {
                String[] a = step.split(",");
                Admin admin = admins.computeIfAbsent(a[1], ShareAdmin::admin);
                try {
                    run(admin, a);
                    System.out.println("done");
                } catch (Exception e) {
                    Throwable cause = e.getCause() != null ? e.getCause() : e;
                    System.out.println("error " + cause.getClass().getSimpleName() + " " + cause.getMessage());
                }
            }
        } finally {
            admins.values().forEach(Admin::close);
        }
        System.out.flush();
    }

    private static Admin admin(String bootstrap) {
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        return Admin.create(props);
    }

    private static void run(Admin admin, String[] a) throws Exception {
        String group = a[2];
        switch (a[0]) {
            case "describe" -> {
                ShareGroupDescription d = admin.describeShareGroups(Collections.singleton(group))
                    .describedGroups().get(group).get();
                System.out.println("group " + d.groupState() + " " + d.members().size() + " " + d.groupEpoch());
            }
            case "offsets" -> {
                Map<TopicPartition, SharePartitionOffsetInfo> offsets = admin
                    .listShareGroupOffsets(Map.of(group, new ListShareGroupOffsetsSpec()))
                    .partitionsToOffsetInfo(group).get();
                offsets.forEach((tp, info) -> System.out.println("offset " + tp.topic() + " "
                    + tp.partition() + " " + info.startOffset() + " " + info.lag().orElse(-1L)));
            }
            case "alter" -> admin.alterShareGroupOffsets(group, Map.of(
                    new TopicPartition(a[3], Integer.parseInt(a[4])), Long.parseLong(a[5])))
                .all().get();
            case "delete-offsets" -> admin.deleteShareGroupOffsets(group, Set.of(a[3])).all().get();
            case "delete" -> admin.deleteShareGroups(Collections.singleton(group)).all().get();
            default -> throw new IllegalArgumentException(a[0]);
        }
    }
}

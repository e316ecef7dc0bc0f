import java.util.Collections;
import java.util.Map;
import java.util.Properties;
import java.util.Set;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ListShareGroupOffsetsSpec;
import org.apache.kafka.clients.admin.ShareGroupDescription;
import org.apache.kafka.clients.admin.SharePartitionOffsetInfo;
import org.apache.kafka.common.TopicPartition;

/**
 * The Java Admin client's share group calls (what kafka-share-groups.sh uses):
 * "ShareAdmin describe|offsets|alter|delete-offsets|delete BOOTSTRAP GROUP [TOPIC [P OFFSET]]".
 * Prints "group STATE MEMBERS EPOCH", "offset TOPIC P START LAG", "done", or
 * "error EXCEPTION MESSAGE" (exit 1).
 */
public class ShareAdmin {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[1]);
        String group = args[2];
        try (Admin admin = Admin.create(props)) {
            switch (args[0]) {
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
                        new TopicPartition(args[3], Integer.parseInt(args[4])), Long.parseLong(args[5])))
                    .all().get();
                case "delete-offsets" -> admin.deleteShareGroupOffsets(group, Set.of(args[3])).all().get();
                case "delete" -> admin.deleteShareGroups(Collections.singleton(group)).all().get();
                default -> throw new IllegalArgumentException(args[0]);
            }
            System.out.println("done");
        } catch (Exception e) {
            Throwable cause = e.getCause() != null ? e.getCause() : e;
            System.out.println("error " + cause.getClass().getSimpleName() + " " + cause.getMessage());
            System.exit(1);
        }
    }
}

import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.DescribeConfigsOptions;
import org.apache.kafka.common.config.ConfigResource;

/**
 * A consumer group's own configs (KIP-848) through the Java AdminClient, what
 * kafka-configs.sh --entity-type groups sends, as a small command line:
 *
 *   alter BOOTSTRAP GROUP NAME=VALUE[,NAME=VALUE...]   (NAME= deletes NAME)
 *   describe BOOTSTRAP GROUP
 *
 * alter prints "ok"; describe prints one "entry NAME SOURCE VALUE" line per config;
 * either prints "error CLASS MESSAGE" (exit 1) when refused.
 */
public class GroupConfigsAdmin {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[1]);
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        ConfigResource resource = new ConfigResource(ConfigResource.Type.GROUP, args[2]);
        try (Admin admin = Admin.create(props)) {
            if (args[0].equals("alter")) {
                Collection<AlterConfigOp> ops = new ArrayList<>();
                for (String pair : args[3].split(",")) {
                    String[] kv = pair.split("=", 2);
                    ops.add(kv[1].isEmpty()
                        ? new AlterConfigOp(new ConfigEntry(kv[0], null), AlterConfigOp.OpType.DELETE)
                        : new AlterConfigOp(new ConfigEntry(kv[0], kv[1]), AlterConfigOp.OpType.SET));
                }
                admin.incrementalAlterConfigs(Map.of(resource, ops)).all().get();
                System.out.println("ok");
            } else {
                Map<ConfigResource, Config> configs = admin.describeConfigs(
                    Collections.singleton(resource),
                    new DescribeConfigsOptions().includeSynonyms(true)).all().get();
                for (ConfigEntry entry : configs.get(resource).entries()) {
                    System.out.println(
                        "entry " + entry.name() + " " + entry.source() + " " + entry.value());
                }
            }
        } catch (Exception e) {
            Throwable cause = e.getCause() != null ? e.getCause() : e;
            System.out.println("error " + cause.getClass().getSimpleName() + " " + cause.getMessage());
            System.exit(1);
        }
    }
}

import java.util.Collections;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.DescribeConfigsOptions;
import org.apache.kafka.common.config.ConfigResource;

/**
 * The Java AdminClient's describeConfigs with includeSynonyms (what kafka-configs.sh
 * --describe --all and UIs send), as a small command line:
 *
 *   describe BOOTSTRAP topic|broker NAME
 *
 * Prints one "entry NAME SOURCE VALUE" line per config, each followed by its
 * "synonym NAME SOURCE VALUE" lines in the order given, or "error CLASS MESSAGE" (exit 1).
 */
public class ConfigsAdmin {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[1]);
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        ConfigResource.Type type =
            args[2].equals("topic") ? ConfigResource.Type.TOPIC : ConfigResource.Type.BROKER;
        ConfigResource resource = new ConfigResource(type, args[3]);
        try (Admin admin = Admin.create(props)) {
            Map<ConfigResource, Config> configs = admin.describeConfigs(
                Collections.singleton(resource),
                new DescribeConfigsOptions().includeSynonyms(true)).all().get();
            for (ConfigEntry entry : configs.get(resource).entries()) {
                System.out.println("entry " + entry.name() + " " + entry.source() + " " + entry.value());
                for (ConfigEntry.ConfigSynonym synonym : entry.synonyms()) {
                    System.out.println("synonym " + synonym.name() + " " + synonym.source() + " "
                        + synonym.value());
                }
            }
        } catch (Exception e) {
            Throwable cause = e.getCause() != null ? e.getCause() : e;
            System.out.println("error " + cause.getClass().getSimpleName() + " " + cause.getMessage());
            System.exit(1);
        }
    }
}

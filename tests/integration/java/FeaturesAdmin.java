import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.FeatureMetadata;
import org.apache.kafka.clients.admin.FeatureUpdate;
import org.apache.kafka.clients.admin.FinalizedVersionRange;
import org.apache.kafka.clients.admin.SupportedVersionRange;
import org.apache.kafka.clients.admin.UpdateFeaturesOptions;

/**
 * The Java AdminClient's feature calls, what kafka-features.sh runs. Arguments: the bootstrap,
 * then one or more steps run in order on one Admin (one JVM start for a test's whole sequence,
 * ~2.5 s of CPU each), each one argument: "describe" prints one line per finalized and
 * supported feature; "update FEATURE LEVEL TYPE dry|apply" (TYPE one of UPGRADE,
 * SAFE_DOWNGRADE, UNSAFE_DOWNGRADE; dry is --dry-run) prints "ok", or "error", the exception's
 * class and its message. Each step's output ends with a line "end".
 */
public class FeaturesAdmin {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        try (Admin admin = Admin.create(props)) {
            for (int i = 1; i < args.length; i++) {
                String[] step = args[i].split(" ");
                if (step[0].equals("describe")) {
                    describe(admin);
                } else {
                    update(admin, step[1], Short.parseShort(step[2]), step[3], step[4].equals("dry"));
                }
                System.out.println("end");
            }
        }
    }

    static void describe(Admin admin) throws Exception {
        FeatureMetadata metadata = admin.describeFeatures().featureMetadata().get();
        for (Map.Entry<String, FinalizedVersionRange> e : metadata.finalizedFeatures().entrySet()) {
            System.out.println("finalized " + e.getKey() + " " + e.getValue().minVersionLevel()
                + " " + e.getValue().maxVersionLevel());
        }
        for (Map.Entry<String, SupportedVersionRange> e : metadata.supportedFeatures().entrySet()) {
            System.out.println("supported " + e.getKey() + " " + e.getValue().minVersion()
                + " " + e.getValue().maxVersion());
        }
    }

    static void update(Admin admin, String feature, short level, String type, boolean dry)
            throws Exception {
        FeatureUpdate update = new FeatureUpdate(level, FeatureUpdate.UpgradeType.valueOf(type));
        try {
            admin.updateFeatures(Map.of(feature, update), new UpdateFeaturesOptions().validateOnly(dry))
                .all().get();
            System.out.println("ok");
        } catch (ExecutionException e) {
            System.out.println("error " + e.getCause().getClass().getSimpleName() + " "
                + e.getCause().getMessage());
        }
    }
}

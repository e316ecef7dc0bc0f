import java.util.Collection;
import java.util.List;
import java.util.Properties;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AccessControlEntryFilter;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclBindingFilter;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourcePatternFilter;
import org.apache.kafka.common.resource.ResourceType;

/**
 * The Java AdminClient's ACL calls (what kafka-acls.sh uses) against a broker: create a binding
 * on the topic args[1], describe every binding, delete the topic's bindings, describe again.
 * Prints one line per step; an exception prints its class and exits 1.
 */
public class AclAdmin {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        String topic = args[1];
        try (Admin admin = Admin.create(props)) {
            AclBinding binding = new AclBinding(
                new ResourcePattern(ResourceType.TOPIC, topic, PatternType.PREFIXED),
                new AccessControlEntry("User:ANONYMOUS", "*", AclOperation.READ, AclPermissionType.ALLOW));
            admin.createAcls(List.of(binding)).all().get();
            System.out.println("created");
            print("described", admin.describeAcls(AclBindingFilter.ANY).values().get());
            AclBindingFilter mine = new AclBindingFilter(
                new ResourcePatternFilter(ResourceType.TOPIC, topic, PatternType.ANY),
                AccessControlEntryFilter.ANY);
            print("deleted", admin.deleteAcls(List.of(mine)).all().get());
            print("after", admin.describeAcls(mine).values().get());
        } catch (Exception e) {
            Throwable cause = e.getCause() != null ? e.getCause() : e;
            System.out.println("error " + cause.getClass().getSimpleName());
            System.exit(1);
        }
    }

    private static void print(String step, Collection<AclBinding> bindings) {
        System.out.println(step + " " + bindings.size());
        for (AclBinding b : bindings) {
            System.out.println("  " + b.pattern().resourceType() + " " + b.pattern().patternType()
                + " " + b.pattern().name() + " " + b.entry().principal() + " " + b.entry().host()
                + " " + b.entry().operation() + " " + b.entry().permissionType());
        }
    }
}

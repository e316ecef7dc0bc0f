import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterClientQuotasOptions;
import org.apache.kafka.common.quota.ClientQuotaAlteration;
import org.apache.kafka.common.quota.ClientQuotaEntity;
import org.apache.kafka.common.quota.ClientQuotaFilter;
import org.apache.kafka.common.quota.ClientQuotaFilterComponent;

/**
 * The Java AdminClient's client-quota calls (what kafka-configs.sh --entity-type users|clients
 * sends), as a small command line:
 *
 *   alter BOOTSTRAP ENTITY [--validate] key=value|key=  (ENTITY: user=alice,client-id=<default>;
 *                                                        "key=" removes the key)
 *   describe BOOTSTRAP [strict] [type=name|type=<default>|type=*]...
 *
 * Prints "ok", or one "entity ... values ..." line per described entity (sorted), or
 * "error CLASS MESSAGE" (exit 1). Run with "serve" it answers such calls from stdin instead
 * (tests/harness/java_session.py: one JVM for the module's dozens of calls).
 */
public class QuotaAdmin {
    public static void main(String[] args) throws Exception {
        if (args.length == 1 && args[0].equals("serve")) {
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
            for (String line = in.readLine(); line != null; line = in.readLine()) {
                System.out.println("end " + run(line.split("\t")));
                System.out.flush();
            }
            return;
        }
        System.exit(run(args));
    }

    /** One call with a new Admin: the exit code a run of it has. */
    private static int run(String[] args) {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[1]);
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        try (Admin admin = Admin.create(props)) {
            if (args[0].equals("alter")) {
                alter(admin, args);
            } else {
                describe(admin, args);
            }
            return 0;
        } catch (Exception e) {
            Throwable cause = e.getCause() != null ? e.getCause() : e;
            System.out.println("error " + cause.getClass().getSimpleName() + " " + cause.getMessage());
            return 1;
        }
    }

    private static String name(String value) {
        return value.equals("<default>") ? null : value;
    }

    private static void alter(Admin admin, String[] args) throws Exception {
        Map<String, String> parts = new HashMap<>();
        for (String part : args[2].split(",")) {
            String[] kv = part.split("=", 2);
            parts.put(kv[0], name(kv[1]));
        }
        boolean validate = false;
        List<ClientQuotaAlteration.Op> ops = new ArrayList<>();
        for (int i = 3; i < args.length; i++) {
            if (args[i].equals("--validate")) {
                validate = true;
                continue;
            }
            String[] kv = args[i].split("=", 2);
            ops.add(new ClientQuotaAlteration.Op(kv[0], kv[1].isEmpty() ? null : Double.valueOf(kv[1])));
        }
        ClientQuotaAlteration alteration = new ClientQuotaAlteration(new ClientQuotaEntity(parts), ops);
        admin.alterClientQuotas(List.of(alteration), new AlterClientQuotasOptions().validateOnly(validate))
            .all().get();
        System.out.println("ok");
    }

    private static void describe(Admin admin, String[] args) throws Exception {
        boolean strict = false;
        List<ClientQuotaFilterComponent> components = new ArrayList<>();
        for (int i = 2; i < args.length; i++) {
            if (args[i].equals("strict")) {
                strict = true;
                continue;
            }
            String[] kv = args[i].split("=", 2);
            if (kv[1].equals("*")) {
                components.add(ClientQuotaFilterComponent.ofEntityType(kv[0]));
            } else if (kv[1].equals("<default>")) {
                components.add(ClientQuotaFilterComponent.ofDefaultEntity(kv[0]));
            } else {
                components.add(ClientQuotaFilterComponent.ofEntity(kv[0], kv[1]));
            }
        }
        ClientQuotaFilter filter = strict ? ClientQuotaFilter.containsOnly(components) : ClientQuotaFilter.contains(components);
        Map<ClientQuotaEntity, Map<String, Double>> found = admin.describeClientQuotas(filter).entities().get();
        List<String> lines = new ArrayList<>();
        for (Map.Entry<ClientQuotaEntity, Map<String, Double>> entry : found.entrySet()) {
            StringBuilder line = new StringBuilder("entity");
            for (Map.Entry<String, String> part : new TreeMap<>(nulls(entry.getKey().entries())).entrySet()) {
                line.append(' ').append(part.getKey()).append('=').append(part.getValue());
            }
            line.append(" values");
            for (Map.Entry<String, Double> value : new TreeMap<>(entry.getValue()).entrySet()) {
                line.append(' ').append(value.getKey()).append('=').append(value.getValue().longValue());
            }
            lines.add(line.toString());
        }
        lines.sort(null);
        lines.forEach(System.out::println);
    }

    private static Map<String, String> nulls(Map<String, String> entries) {
        Map<String, String> out = new HashMap<>();
        entries.forEach((k, v) -> out.put(k, v == null ? "<default>" : v));
        return out;
    }
}

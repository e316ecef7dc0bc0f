import java.util.Properties;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.QuorumInfo;

/**
 * The Java AdminClient's describeMetadataQuorum (what kafka-metadata-quorum.sh
 * --bootstrap-server describe runs) against args[0], then describeCluster on the same client
 * (the client still works). One line per step: "quorum leader N" or "error Class message",
 * then "cluster N nodes". The call's own timeout is long (120 s): an answer that never came
 * shows as a TimeoutException, not as a quick failure.
 */
public class QuorumAdmin {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "120000");
        props.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "120000");
        try (Admin admin = Admin.create(props)) {
            try {
                QuorumInfo info = admin.describeMetadataQuorum().quorumInfo().get(180, TimeUnit.SECONDS);
                System.out.println("quorum leader " + info.leaderId());
            } catch (Exception e) {
                Throwable cause = e.getCause() != null ? e.getCause() : e;
                System.out.println("error " + cause.getClass().getSimpleName() + " " + cause.getMessage());
            }
            System.out.println("cluster " + admin.describeCluster().nodes().get(60, TimeUnit.SECONDS).size() + " nodes");
        }
    }
}

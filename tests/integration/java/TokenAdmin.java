import java.io.BufferedReader;
import java.io.FileReader;
import java.io.InputStreamReader;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.List;
import java.util.Properties;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.CreateDelegationTokenOptions;
import org.apache.kafka.clients.admin.DescribeDelegationTokenOptions;
import org.apache.kafka.clients.admin.ExpireDelegationTokenOptions;
import org.apache.kafka.clients.admin.RenewDelegationTokenOptions;
import org.apache.kafka.common.security.auth.KafkaPrincipal;
import org.apache.kafka.common.security.token.delegation.DelegationToken;
import org.apache.kafka.common.security.token.delegation.TokenInformation;

/**
 * The Java AdminClient's delegation-token calls (what kafka-delegation-tokens.sh runs), each
 * with a new Admin and the security settings of a properties file:
 *
 *   create BOOTSTRAP MAX_LIFETIME_MS [OWNER|-] [RENEWER...]  → "token ID HMAC_BASE64 EXPIRY MAX"
 *   renew BOOTSTRAP HMAC_BASE64 PERIOD_MS                    → "renewed EXPIRY"
 *   expire BOOTSTRAP HMAC_BASE64 PERIOD_MS                   → "expired EXPIRY"
 *   describe BOOTSTRAP [OWNER...]                            → "described N", then per token
 *                                                               "  ID OWNER REQUESTER HMAC [RENEWER...]"
 *
 * A failure prints "error EXCEPTION_CLASS" and exits 1. The properties come from
 * $CLIENT_PROPERTIES; run with "serve" it answers calls from stdin instead (tests/harness/
 * java_session.py: one JVM for the module's dozens of calls), each preceded by the properties
 * file's path (or "-").
 */
public class TokenAdmin {
    public static void main(String[] args) throws Exception {
        if (args.length == 1 && args[0].equals("serve")) {
            serve();
            return;
        }
        if (!call(System.getenv("CLIENT_PROPERTIES"), args)) {
            System.exit(1);
        }
    }

    private static void serve() throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        for (String line = in.readLine(); line != null; line = in.readLine()) {
            String[] words = line.split("\t");
            String properties = words[0].equals("-") ? null : words[0];
            boolean ok = call(properties, Arrays.copyOfRange(words, 1, words.length));
            System.out.println(ok ? "end 0" : "end 1");
            System.out.flush();
        }
    }

    /** One call with a new Admin; false when it failed. */
    private static boolean call(String properties, String[] args) throws Exception {
        Properties props = new Properties();
        if (properties != null) {
            try (FileReader reader = new FileReader(properties)) {
                props.load(reader);
            }
        }
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[1]);
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        try (Admin admin = Admin.create(props)) {
            switch (args[0]) {
                case "create" -> create(admin, args);
                case "renew" -> System.out.println("renewed " + admin.renewDelegationToken(
                    hmac(args[2]), new RenewDelegationTokenOptions().renewTimePeriodMs(
                        Long.parseLong(args[3]))).expiryTimestamp().get());
                case "expire" -> System.out.println("expired " + admin.expireDelegationToken(
                    hmac(args[2]), new ExpireDelegationTokenOptions().expiryTimePeriodMs(
                        Long.parseLong(args[3]))).expiryTimestamp().get());
                default -> describe(admin, args);
            }
            return true;
        } catch (Exception e) {
            Throwable cause = e.getCause() != null ? e.getCause() : e;
            System.out.println("error " + cause.getClass().getSimpleName());
            return false;
        }
    }

    private static byte[] hmac(String base64) {
        return Base64.getDecoder().decode(base64);
    }

    private static KafkaPrincipal principal(String text) {
        int colon = text.indexOf(':');
        return new KafkaPrincipal(text.substring(0, colon), text.substring(colon + 1));
    }

    private static List<KafkaPrincipal> principals(String[] args, int from) {
        List<KafkaPrincipal> found = new ArrayList<>();
        for (int i = from; i < args.length; i++) {
            found.add(principal(args[i]));
        }
        return found;
    }

    private static void create(Admin admin, String[] args) throws Exception {
        CreateDelegationTokenOptions options = new CreateDelegationTokenOptions()
            .maxLifetimeMs(Long.parseLong(args[2]))
            .renewers(principals(args, 4));
        if (args.length > 3 && !args[3].equals("-")) {
            options.owner(principal(args[3]));
        }
        DelegationToken token = admin.createDelegationToken(options).delegationToken().get();
        TokenInformation info = token.tokenInfo();
        System.out.println("token " + info.tokenId() + " " + token.hmacAsBase64String() + " "
            + info.expiryTimestamp() + " " + info.maxTimestamp());
    }

    private static void describe(Admin admin, String[] args) throws Exception {
        DescribeDelegationTokenOptions options = new DescribeDelegationTokenOptions();
        if (args.length > 2) {
            options.owners(principals(args, 2));
        }
        List<DelegationToken> tokens = admin.describeDelegationToken(options).delegationTokens().get();
        System.out.println("described " + tokens.size());
        for (DelegationToken token : tokens) {
            TokenInformation info = token.tokenInfo();
            StringBuilder line = new StringBuilder("  " + info.tokenId() + " " + info.ownerAsString()
                + " " + info.tokenRequesterAsString() + " " + token.hmacAsBase64String());
            for (String renewer : info.renewersAsString()) {
                line.append(" ").append(renewer);
            }
            System.out.println(line);
        }
    }
}

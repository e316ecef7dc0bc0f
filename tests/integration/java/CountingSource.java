import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.source.ExactlyOnceSupport;
import org.apache.kafka.connect.source.SourceConnector;
import org.apache.kafka.connect.source.SourceRecord;
import org.apache.kafka.connect.source.SourceTask;

/**
 * A source connector with as many tasks as tasks.max, each counting up ("task-N-I" to topic
 * "topic", a few records a poll), its position stored as Connect source offsets. It declares
 * exactly-once support, so a worker with exactly.once.source.support=enabled runs each task
 * with its own transactional producer and, when the task count changes, fences the previous
 * generation's producers (Admin.fenceProducers) before the new tasks start: the path that
 * KafScale's InitProducerId serves for Connect.
 */
public class CountingSource extends SourceConnector {
    private Map<String, String> props;

    @Override
    public void start(Map<String, String> props) {
        this.props = props;
    }

    @Override
    public Class<? extends org.apache.kafka.connect.connector.Task> taskClass() {
        return CountingTask.class;
    }

    @Override
    public List<Map<String, String>> taskConfigs(int maxTasks) {
        List<Map<String, String>> configs = new ArrayList<>();
        for (int i = 0; i < maxTasks; i++) {
            Map<String, String> config = new java.util.HashMap<>(props);
            config.put("task.index", Integer.toString(i));
            configs.add(config);
        }
        return configs;
    }

    @Override
    public ExactlyOnceSupport exactlyOnceSupport(Map<String, String> props) {
        return ExactlyOnceSupport.SUPPORTED;
    }

    @Override
    public void stop() {}

    @Override
    public ConfigDef config() {
        return new ConfigDef()
                .define("topic", ConfigDef.Type.STRING, ConfigDef.Importance.HIGH, "target");
    }

    @Override
    public String version() {
        return "1";
    }

    /** One counting task. */
    public static class CountingTask extends SourceTask {
        private String topic;
        private String index;
        private long next;

        @Override
        public void start(Map<String, String> props) {
            topic = props.get("topic");
            index = props.get("task.index");
            Map<String, Object> stored = context.offsetStorageReader().offset(partition());
            next = stored == null ? 0 : ((Number) stored.get("next")).longValue();
        }

        private Map<String, String> partition() {
            return Collections.singletonMap("task", index);
        }

        @Override
        public List<SourceRecord> poll() throws InterruptedException {
            Thread.sleep(100);
            List<SourceRecord> records = new ArrayList<>();
            for (int i = 0; i < 3; i++, next++) {
                records.add(
                        new SourceRecord(
                                partition(),
                                Collections.singletonMap("next", next + 1),
                                topic,
                                0,
                                Schema.STRING_SCHEMA,
                                "task-" + index + "-" + next));
            }
            return records;
        }

        @Override
        public void stop() {}

        @Override
        public String version() {
            return "1";
        }
    }
}

import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.HexFormat;

import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.record.internal.MemoryRecords;
import org.apache.kafka.common.record.internal.MutableRecordBatch;
import org.apache.kafka.common.record.internal.Record;

/**
 * Kafka's own record batch reader (kafka-clients' MemoryRecords, as a consumer's fetcher uses it)
 * over files of concatenated v2 batches: the cleaner's output must pass its CRC check and its
 * decompressors (KafkaLZ4BlockInputStream, xerial snappy, zstd-jni, gzip).
 *
 * FILE...: per file "file PATH"; per batch "batch BASE LAST_OFFSET PRODUCER_ID PRODUCER_EPOCH
 * BASE_SEQUENCE LEADER_EPOCH CODEC TRANSACTIONAL CONTROL MAX_TIMESTAMP COUNT DELETE_HORIZON" (the
 * KIP-534 delete horizon the cleaner wrote, "-" for none); per record of a
 * data batch "record OFFSET TIMESTAMP KEY VALUE HEADERS" with bytes in hex, "-" for null and
 * headers as NAME=HEX (or NAME=-) joined by ",", "-" when there are none. A batch that fails
 * ensureValid() or cannot be decompressed ends the program with an exception (exit code 1).
 */
public class BatchReader {
    private static final HexFormat HEX = HexFormat.of();

    public static void main(String[] args) throws Exception {
        for (String path : args) {
            System.out.println("file " + path);
            MemoryRecords records = MemoryRecords.readableRecords(
                ByteBuffer.wrap(Files.readAllBytes(Paths.get(path))));
            for (MutableRecordBatch batch : records.batches()) {
                batch.ensureValid();
                System.out.println(String.join(" ", "batch",
                    Long.toString(batch.baseOffset()), Long.toString(batch.lastOffset()),
                    Long.toString(batch.producerId()), Short.toString(batch.producerEpoch()),
                    Integer.toString(batch.baseSequence()),
                    Integer.toString(batch.partitionLeaderEpoch()), batch.compressionType().name,
                    Boolean.toString(batch.isTransactional()), Boolean.toString(batch.isControlBatch()),
                    Long.toString(batch.maxTimestamp()), String.valueOf(batch.countOrNull()),
                    batch.deleteHorizonMs().isPresent()
                        ? Long.toString(batch.deleteHorizonMs().getAsLong()) : "-"));
                if (batch.isControlBatch()) {
                    continue;
                }
                for (Record record : batch) {
                    record.ensureValid();
                    System.out.println(String.join(" ", "record", Long.toString(record.offset()),
                        Long.toString(record.timestamp()), hex(record.key()), hex(record.value()),
                        headers(record.headers())));
                }
            }
        }
    }

    private static String hex(ByteBuffer buffer) {
        if (buffer == null) {
            return "-";
        }
        byte[] bytes = new byte[buffer.remaining()];
        buffer.duplicate().get(bytes);
        return bytes.length == 0 ? "=" : HEX.formatHex(bytes);
    }

    private static String headers(Header[] headers) {
        if (headers.length == 0) {
            return "-";
        }
        StringBuilder out = new StringBuilder();
        for (Header header : headers) {
            if (out.length() > 0) {
                out.append(',');
            }
            byte[] value = header.value();
            out.append(header.key()).append('=')
                .append(value == null ? "-" : value.length == 0 ? "=" : HEX.formatHex(value));
        }
        return out.toString();
    }
}

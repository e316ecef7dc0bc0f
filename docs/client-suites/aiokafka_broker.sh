#!/bin/bash
# usage: aiokafka_broker.sh DATA_DIR PORT MODE(broker|proxy) -> starts kafscale local for aiokafka's suite
D=$1; P=$2; MODE=$3; S=${AIO_SSL_DIR:?certificates made by aiokafka's gen-ssl-certs.sh}; KS=${KAFSCALE_BIN:-kafscale}
COMMON="--data-dir $D --topics-num-partitions 2 --groups-min-session-timeout-ms 1000 --groups-initial-rebalance-delay-ms 0 \
 --authorizer-enabled true --authorizer-allow-everyone-if-no-acl-found true --authorizer-super-users [\"User:admin\"] \
 --tls-cert-file $S/server.crt --tls-key-file $S/server.key --tls-ca-file $S/ca.crt --tls-client-auth-overrides SSL:required"
LST="--listeners PLAINTEXT://127.0.0.1:$P,SSL://127.0.0.1:$((P+1)),SASL_PLAINTEXT://127.0.0.1:$((P+2)),SASL_SSL://127.0.0.1:$((P+3))"
if [ "$MODE" = proxy ]; then
  # the proxy takes P..P+3 as its listeners; its brokers --port+1.. : give --port well away
  exec env -u KAFSCALE_ETCD $KS local --port $((P+10)) --brokers 3 --proxy $LST $COMMON
else
  exec $KS local --port $P --brokers 1 $LST $COMMON
fi

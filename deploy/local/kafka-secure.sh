#!/usr/bin/env bash
# A Kafka broker configured as managed Kafka services usually are: one SASL_SSL listener
# (TLS, and a user and password checked with SCRAM-SHA-512), no plaintext port for
# clients. The integration tests run the bus against it (tests/integration/test_kafka_security.py).
#
#   deploy/local/kafka-secure.sh up DIR PORT   make a CA, a server certificate and two SCRAM
#                                              users in DIR, start the broker on
#                                              127.0.0.1:PORT (its controller on PORT+1),
#                                              print the SWITCHYARD_KAFKA_* settings a
#                                              client needs, one VAR=VALUE a line
#   deploy/local/kafka-secure.sh down DIR      stop the broker started in DIR
#
# The same official jars as deploy/local/kafka.sh (fetched once). Users: `switchyard`
# (for clients) and `broker` (the broker's own connections to its listener).
set -euo pipefail
SCRIPT_NAME=kafka-secure.sh
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
source "$HERE/lib.sh"

KAFKA_VERSION=3.9.1
LIBS="$SWITCHYARD_CACHE_DIR/kafka-$KAFKA_VERSION/libs"

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; }

kafka_java() {
  java -cp "$LIBS/*" -Dlog4j.configuration="file:$HERE/kafka/log4j.properties" "$@"
}

# The broker reads its key and certificate from a PKCS12 store.
keystore() {
  local dir=$1 store_password=$2
  test_certificates "$dir" || return 1
  openssl pkcs12 -export -in "$dir/server.crt" -inkey "$dir/server.key" -name kafka \
    -out "$dir/server.p12" -passout "pass:$store_password" >/dev/null 2>&1
}

up() {
  local dir=$1 port=$2 controller_port=$(($2 + 1))
  local store_password broker_password client_password cluster_id
  command -v openssl >/dev/null || die "openssl is missing (apt-get install openssl)"
  command -v java >/dev/null || die "Java 17 is needed (apt-get install openjdk-17-jre-headless)"
  "$HERE/kafka.sh" fetch >&2
  port_open 127.0.0.1 "$port" && die "port $port is taken"
  port_open 127.0.0.1 "$controller_port" && die "controller port $controller_port is taken"
  mkdir -p "$dir/data"
  store_password=$(openssl rand -hex 16)
  broker_password=$(openssl rand -hex 16)
  client_password=$(openssl rand -hex 24)
  keystore "$dir" "$store_password" || die "openssl could not make the certificates in $dir"
  cat >"$dir/server.properties" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$controller_port
listeners=SASL_SSL://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller_port
advertised.listeners=SASL_SSL://127.0.0.1:$port
controller.listener.names=CONTROLLER
listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT
inter.broker.listener.name=SASL_SSL
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="broker" password="$broker_password";
ssl.keystore.type=PKCS12
ssl.keystore.location=$dir/server.p12
ssl.keystore.password=$store_password
ssl.key.password=$store_password
ssl.truststore.type=PEM
ssl.truststore.location=$dir/ca.crt
ssl.client.auth=none
log.dirs=$dir/data
num.partitions=4
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
auto.create.topics.enable=true
delete.topic.enable=true
EOF
  chmod 600 "$dir/server.properties" "$dir"/*.key "$dir/server.p12"
  cluster_id=$(kafka_java kafka.tools.StorageTool random-uuid 2>>"$dir/format.log") \
    || die "could not make a cluster id (log: $dir/format.log)"
  kafka_java kafka.tools.StorageTool format -t "$cluster_id" -c "$dir/server.properties" \
    --add-scram "SCRAM-SHA-512=[name=broker,password=$broker_password]" \
    --add-scram "SCRAM-SHA-512=[name=switchyard,password=$client_password]" \
    >>"$dir/format.log" 2>&1 || { tail -n 20 "$dir/format.log" >&2; die "formatting the storage failed"; }
  setsid nohup java -Xms128m -Xmx384m -XX:+UseG1GC -Djava.awt.headless=true \
    -cp "$LIBS/*" -Dlog4j.configuration="file:$HERE/kafka/log4j.properties" \
    kafka.Kafka "$dir/server.properties" >>"$dir/kafka.log" 2>&1 </dev/null &
  echo $! >"$dir/kafka.pid"
  if ! wait_for 60 grep -q "Kafka Server started" "$dir/kafka.log"; then
    tail -n 30 "$dir/kafka.log" >&2 || true
    stop_pid "$dir/kafka.pid" 5
    die "the broker did not start within 60 s (log $dir/kafka.log)"
  fi
  say "Kafka with SASL_SSL (SCRAM-SHA-512) at 127.0.0.1:$port (log $dir/kafka.log)"
  printf 'SWITCHYARD_KAFKA_BOOTSTRAP=127.0.0.1:%s\n' "$port"
  printf 'SWITCHYARD_KAFKA_SECURITY_PROTOCOL=SASL_SSL\n'
  printf 'SWITCHYARD_KAFKA_SASL_MECHANISM=SCRAM-SHA-512\n'
  printf 'SWITCHYARD_KAFKA_SASL_USERNAME=switchyard\n'
  printf 'SWITCHYARD_KAFKA_SASL_PASSWORD=%s\n' "$client_password"
  printf 'SWITCHYARD_KAFKA_SSL_CAFILE=%s\n' "$dir/ca.crt"
}

down() {
  local dir=$1
  if [[ -f "$dir/kafka.pid" ]]; then
    stop_pid "$dir/kafka.pid" 20
    say "Kafka (SASL_SSL) in $dir stopped"
  fi
}

case "${1:-}" in
  up) [[ $# -eq 3 ]] || { usage >&2; exit 2; }; up "$2" "$3" ;;
  down) [[ $# -eq 2 ]] || { usage >&2; exit 2; }; down "$2" ;;
  -h|--help) usage ;;
  *) usage >&2; exit 2 ;;
esac

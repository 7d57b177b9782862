#!/usr/bin/env bash
# kafka-run-class.sh CLASS [ARGS]: a class of the broker jars with the tools' logging.
exec java ${KAFKA_HEAP_OPTS:--Xmx128m} -XX:TieredStopAtLevel=1 -Xshare:auto -cp "/opt/kafka/libs/*" \
  -Dlog4j.configuration=file:/opt/kafka/config/tools-log4j.properties "$@"

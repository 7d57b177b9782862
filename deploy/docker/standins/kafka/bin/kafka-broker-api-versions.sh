#!/usr/bin/env bash
# What the compose file's health check calls, as in the official image.
exec "$(dirname "$0")/kafka-run-class.sh" kafka.admin.BrokerApiVersionsCommand "$@"

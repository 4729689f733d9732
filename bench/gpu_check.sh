#!/usr/bin/env bash
# The entry point other sessions run on a lent GPU machine (`OUT=/tmp/out bench/gpu_check.sh`):
# the check itself is bench/hardware/gpu_check.sh.
exec "$(dirname "$0")/hardware/gpu_check.sh" "$@"

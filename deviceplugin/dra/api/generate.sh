#!/usr/bin/env bash
# Regenerates the Python stubs of the kubelet DRA APIs (dra.proto: v1 DRAPlugin; health.proto and
# health_v1.proto: v1alpha1 and v1 DRAResourceHealth; registration.proto: the plugin watcher's
# pluginregistration).
#   generate.sh          write the *_pb2.py, *_pb2_grpc.py and their .pyi here
#   generate.sh --check  generate into a temporary directory and fail if anything differs
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
for proto in dra health health_v1 registration; do
  "$root/.ci/protostubs.sh" "deviceplugin/dra/api/$proto.proto" "$@"
done

#!/usr/bin/env bash
# Regenerates the Python stubs of the kubelet device-plugin API from deviceplugin.proto.
#   generate.sh          write deviceplugin_pb2.py, deviceplugin_pb2_grpc.py and their .pyi here
#   generate.sh --check  generate into a temporary directory and fail if anything differs
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
exec "$root/.ci/protostubs.sh" deviceplugin/api/deviceplugin.proto "$@"

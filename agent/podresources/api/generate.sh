#!/usr/bin/env bash
# Regenerates the Python stubs of the kubelet pod-resources API v1 from api.proto.
#   generate.sh          write api_pb2.py, api_pb2_grpc.py and their .pyi here
#   generate.sh --check  generate into a temporary directory and fail if anything differs
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
exec "$root/.ci/protostubs.sh" agent/podresources/api/api.proto "$@"

#!/usr/bin/env bash
# Regenerates the Python stubs of the kubelet pod-resources API v1 from api.proto.
#   generate.sh          write api_pb2.py, api_pb2_grpc.py and their .pyi here
#   generate.sh --check  generate into a temporary directory and fail if anything differs
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
py="${PYTHON:-$root/.venv/bin/python}"
[ -x "$py" ] || py=python3
bindir="$(dirname "$py")"

gen() {  # gen OUTDIR: stubs importable as agent.podresources.api.api_pb2
  local out="$1"
  mkdir -p "$out/agent/podresources/api"
  (cd "$root" && "$py" -m grpc_tools.protoc -I . \
    --plugin=protoc-gen-mypy="$bindir/protoc-gen-mypy" \
    --plugin=protoc-gen-mypy_grpc="$bindir/protoc-gen-mypy_grpc" \
    --python_out="$out" --grpc_python_out="$out" \
    --mypy_out="$out" --mypy_grpc_out="$out" \
    agent/podresources/api/api.proto)
}

files=(api_pb2.py api_pb2.pyi api_pb2_grpc.py api_pb2_grpc.pyi)
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
gen "$tmp"

if [ "${1:-}" = "--check" ]; then
  status=0
  for f in "${files[@]}"; do
    if ! diff -u "$here/$f" "$tmp/agent/podresources/api/$f"; then
      echo "agent/podresources/api/$f is stale: run agent/podresources/api/generate.sh" >&2
      status=1
    fi
  done
  exit "$status"
fi
for f in "${files[@]}"; do cp "$tmp/agent/podresources/api/$f" "$here/$f"; done
echo "regenerated ${files[*]} in agent/podresources/api"

#!/usr/bin/env bash
# Regenerates the Python stubs of the kubelet device-plugin API from deviceplugin.proto.
#   generate.sh          write deviceplugin_pb2.py, deviceplugin_pb2_grpc.py and their .pyi here
#   generate.sh --check  generate into a temporary directory and fail if anything differs
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
py="${PYTHON:-$root/.venv/bin/python}"
[ -x "$py" ] || py=python3
bindir="$(dirname "$py")"

gen() {  # gen OUTDIR: stubs importable as deviceplugin.api.deviceplugin_pb2
  local out="$1"
  mkdir -p "$out/deviceplugin/api"
  (cd "$root" && "$py" -m grpc_tools.protoc -I . \
    --plugin=protoc-gen-mypy="$bindir/protoc-gen-mypy" \
    --plugin=protoc-gen-mypy_grpc="$bindir/protoc-gen-mypy_grpc" \
    --python_out="$out" --grpc_python_out="$out" \
    --mypy_out="$out" --mypy_grpc_out="$out" \
    deviceplugin/api/deviceplugin.proto)
}

files=(deviceplugin_pb2.py deviceplugin_pb2.pyi deviceplugin_pb2_grpc.py deviceplugin_pb2_grpc.pyi)
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
gen "$tmp"

if [ "${1:-}" = "--check" ]; then
  status=0
  for f in "${files[@]}"; do
    if ! diff -u "$here/$f" "$tmp/deviceplugin/api/$f"; then
      echo "deviceplugin/api/$f is stale: run deviceplugin/api/generate.sh" >&2
      status=1
    fi
  done
  exit "$status"
fi
for f in "${files[@]}"; do cp "$tmp/deviceplugin/api/$f" "$here/$f"; done
echo "regenerated ${files[*]} in deviceplugin/api"

#!/usr/bin/env bash
# Python stubs (protobuf, gRPC and their .pyi) of one .proto, written beside it.
#   protostubs.sh PROTO          regenerate the stubs next to PROTO (a path from the repository root)
#   protostubs.sh PROTO --check  generate into a temporary directory and fail if anything differs
# The per-API generate.sh scripts call this; the test command runs them with --check.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
proto="$1"
mode="${2:-}"
dir="$(dirname "$proto")"
base="$(basename "$proto" .proto)"
py="${PYTHON:-$root/.venv/bin/python}"
[ -x "$py" ] || py=python3
bindir="$(dirname "$py")"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/$dir"
# -I . keeps the module path of the stubs (e.g. deviceplugin.api.deviceplugin_pb2)
(cd "$root" && "$py" -m grpc_tools.protoc -I . \
  --plugin=protoc-gen-mypy="$bindir/protoc-gen-mypy" \
  --plugin=protoc-gen-mypy_grpc="$bindir/protoc-gen-mypy_grpc" \
  --python_out="$tmp" --grpc_python_out="$tmp" \
  --mypy_out="$tmp" --mypy_grpc_out="$tmp" \
  "$proto")

files=("${base}_pb2.py" "${base}_pb2.pyi" "${base}_pb2_grpc.py" "${base}_pb2_grpc.pyi")
if [ "$mode" = "--check" ]; then
  status=0
  for f in "${files[@]}"; do
    if ! diff -u "$root/$dir/$f" "$tmp/$dir/$f"; then
      echo "$dir/$f is stale: run $dir/generate.sh" >&2
      status=1
    fi
  done
  exit "$status"
fi
for f in "${files[@]}"; do cp "$tmp/$dir/$f" "$root/$dir/$f"; done
echo "regenerated ${files[*]} in $dir"

#!/usr/bin/env bash
# Builds the deployment tools the manifest tests use (Helm, kustomize) from their Go modules, once per
# machine, into ${XDG_CACHE_HOME:-~/.cache}/gpu-node-agent/deploytools-<versions>/bin. Prints that bin dir.
set -euo pipefail
HELM_VERSION=v3.22.0
KUSTOMIZE_VERSION=v5.8.1  # v5.8.3 needs Go >= 1.27
cache="${XDG_CACHE_HOME:-$HOME/.cache}/gpu-node-agent/deploytools-helm${HELM_VERSION}-kustomize${KUSTOMIZE_VERSION}"
bin="$cache/bin"
mkdir -p "$bin"
build() {  # name module
  local name=$1 module=$2
  if [ -x "$bin/$name" ]; then return 0; fi
  local start=$SECONDS
  echo "building $name from $module (once per machine)" >&2
  if ! GOBIN="$bin" GOFLAGS=-trimpath go install -ldflags='-s -w' "$module" >"$cache/$name.build.log" 2>&1; then
    echo "error: 'go install $module' failed; last lines of $cache/$name.build.log:" >&2
    tail -20 "$cache/$name.build.log" >&2
    exit 1
  fi
  echo "built $name in $((SECONDS - start)) s" >&2
}
build helm "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"
build kustomize "sigs.k8s.io/kustomize/kustomize/v5@${KUSTOMIZE_VERSION}"
echo "$bin"

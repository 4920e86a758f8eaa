#!/usr/bin/env bash
# Builds the real counterparts the e2e tests start on loopback, once per machine:
#   kube-apiserver, kube-scheduler (k8s.io/kubernetes), etcd (go.etcd.io/etcd/server/v3),
#   dmharness (ours: the kubelet's device manager behind a small HTTP API), hollownode (ours: kubemark's
#   hollow kubelet with the kubelet's real device manager) -- one `go build`;
#   vc-scheduler (volcano.sh/volcano, its own module in volcano/) and Volcano's CRD YAMLs.
# Output: ${XDG_CACHE_HOME:-$HOME/.cache}/gpu-node-agent/<hash of versions.env>/{bin,crd}.
# Go's own caches stay where Go keeps them (go env GOCACHE GOMODCACHE).
#
#   build.sh            build what is missing or stale; a second run does nothing
#   build.sh --sync     rewrite go.mod/go.sum (and volcano/) from versions.env, then build
#   build.sh --print-dir  print the output folder and exit
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"

# shellcheck source=versions.env
source "$here/versions.env"
: "${K8S_VERSION:?versions.env must set K8S_VERSION}" "${ETCD_VERSION:?}" "${VOLCANO_VERSION:?}" "${VOLCANO_APIS_VERSION:?}"

versions_hash=$(sha256sum "$here/versions.env" | cut -c1-16)
out="${XDG_CACHE_HOME:-$HOME/.cache}/gpu-node-agent/$versions_hash"
bin="$out/bin"

if [ "${1:-}" = "--print-dir" ]; then echo "$out"; exit 0; fi

if command -v go >/dev/null 2>&1; then GO=$(command -v go); else GO=/usr/local/go/bin/go; fi
[ -x "$GO" ] || { echo "build.sh: no Go toolchain (looked for 'go' on PATH and /usr/local/go/bin/go)" >&2; exit 1; }

k8s_minor_patch=${K8S_VERSION#v1.}            # 37.2
staging_version="v0.$k8s_minor_patch"          # v0.37.2

step() { echo "build.sh: $*"; }

# Runs a command; on failure prints the command, where its full output is, and the tail of it.
run_logged() {
  local log="$1"; shift
  local started=$SECONDS
  if ! "$@" >"$log" 2>&1; then
    echo "build.sh: FAILED (exit after $((SECONDS - started))s): $*" >&2
    echo "build.sh: full output: $log; last lines:" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
}

mod_dir() { (cd "$1" && "$GO" list -m -f '{{.Dir}}' "$2"); }

sync_main() {
  step "sync go.mod: k8s.io/kubernetes $K8S_VERSION (staging modules $staging_version), etcd $ETCD_VERSION"
  "$GO" mod download "k8s.io/kubernetes@$K8S_VERSION"
  local k8s_mod
  k8s_mod=$("$GO" mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')
  local go_directive
  go_directive=$(awk '$1 == "go" {print $2; exit}' "$k8s_mod")
  {
    echo "// Written by build.sh --sync from versions.env: change versions there, not here."
    echo "module gpu-node-agent/e2e/counterparts"
    echo
    echo "go $go_directive"
    echo
    echo "tool ("
    echo "	go.etcd.io/etcd/server/v3"
    echo "	k8s.io/kubernetes/cmd/kube-apiserver"
    echo "	k8s.io/kubernetes/cmd/kube-scheduler"
    echo ")"
    echo
    echo "require ("
    echo "	go.etcd.io/etcd/server/v3 $ETCD_VERSION"
    echo "	k8s.io/kubernetes $K8S_VERSION"
    echo ")"
    echo
    echo "// k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with local folders;"
    echo "// a consumer pins each to the published v0.<minor>.<patch> of the same release."
    echo "replace ("
    awk '$2 == "=>" && $3 ~ /^\.\/staging\// {print $1}' "$k8s_mod" | sort -u | while read -r m; do
      echo "	$m => $m $staging_version"
    done
    echo ")"
  } >go.mod
  rm -f go.sum
  run_logged /tmp/gpu-node-agent-gomod-tidy.log "$GO" mod tidy
}

sync_volcano() {
  step "sync volcano/go.mod: volcano.sh/volcano $VOLCANO_VERSION, volcano.sh/apis $VOLCANO_APIS_VERSION"
  local vc_mod
  vc_mod=$("$GO" mod download -json "volcano.sh/volcano@$VOLCANO_VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')
  local go_directive
  go_directive=$(awk '$1 == "go" {print $2; exit}' "$vc_mod")
  {
    echo "// Written by build.sh --sync from ../versions.env: change versions there, not here."
    echo "// A separate module because Volcano pins its own Kubernetes release."
    echo "module gpu-node-agent/e2e/counterparts/volcano"
    echo
    echo "go $go_directive"
    echo
    echo "tool volcano.sh/volcano/cmd/scheduler"
    echo
    echo "require volcano.sh/volcano $VOLCANO_VERSION"
    echo
    echo "// Volcano's own replace directives (a dependency's replaces do not apply to us), except its local"
    echo "// volcano.sh/apis folder, which a module download lacks: the published apis module stands in."
    echo "replace ("
    # Lines inside Volcano's replace block, and single-line replaces, that point at a module version.
    awk '
      /^replace \($/ {inblock=1; next}
      inblock && /^\)$/ {inblock=0; next}
      inblock && $2 == "=>" && $3 !~ /^\./ {print $1 " => " $3 " " $4; next}
      /^replace / && $3 == "=>" && $4 !~ /^\./ {print $2 " => " $4 " " $5}
    ' "$vc_mod" | grep -v '^volcano.sh/apis ' | sort -u | sed 's/^/\t/'
    echo "	volcano.sh/apis => volcano.sh/apis $VOLCANO_APIS_VERSION"
    echo ")"
  } >volcano/go.mod
  rm -f volcano/go.sum
  (cd volcano && run_logged /tmp/gpu-node-agent-gomod-tidy-volcano.log "$GO" mod tidy)
}

# go.mod must say what versions.env says; otherwise ask for --sync instead of building something else.
check_pins() {
  local got
  got=$("$GO" mod edit -json go.mod | tr -d ' \n\t')
  for want in "\"Path\":\"k8s.io/kubernetes\",\"Version\":\"$K8S_VERSION\"" \
              "\"Path\":\"go.etcd.io/etcd/server/v3\",\"Version\":\"$ETCD_VERSION\"" \
              "\"New\":{\"Path\":\"k8s.io/api\",\"Version\":\"$staging_version\"}"; do
    case "$got" in *"$want"*) ;; *)
      echo "build.sh: $here/go.mod does not match versions.env (missing $want); run: $0 --sync" >&2; exit 1;;
    esac
  done
  got=$("$GO" mod edit -json volcano/go.mod | tr -d ' \n\t')
  for want in "\"Path\":\"volcano.sh/volcano\",\"Version\":\"$VOLCANO_VERSION\"" \
              "\"New\":{\"Path\":\"volcano.sh/apis\",\"Version\":\"$VOLCANO_APIS_VERSION\"}"; do
    case "$got" in *"$want"*) ;; *)
      echo "build.sh: $here/volcano/go.mod does not match versions.env (missing $want); run: $0 --sync" >&2; exit 1;;
    esac
  done
}

# Hash of everything a build group is made from; stored next to the binaries when the group is built.
inputs_hash() { cat "$@" | sha256sum | cut -c1-16; }

fresh() {  # fresh STAMP HASH BINARY...
  local stamp="$1" want="$2"; shift 2
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] || return 1
  local b; for b in "$@"; do [ -x "$bin/$b" ] || return 1; done
}

if [ "${1:-}" = "--sync" ]; then
  sync_main
  sync_volcano
elif [ -n "${1:-}" ]; then
  echo "build.sh: unknown argument '$1' (use --sync or --print-dir)" >&2; exit 2
fi

check_pins
mkdir -p "$bin" "$out/logs"
export CGO_ENABLED=0
total_started=$SECONDS

# Group 1: one `go build` for every binary of the Kubernetes module, so shared packages compile once.
k8s_hash=$(inputs_hash versions.env go.mod go.sum dmharness/*.go hollownode/*.go)
if fresh "$out/.stamp-k8s" "$k8s_hash" kube-apiserver kube-scheduler etcd dmharness hollownode; then
  step "kube-apiserver, kube-scheduler, etcd, dmharness, hollownode: up to date in $bin"
else
  step "building kube-apiserver kube-scheduler ($K8S_VERSION), etcd ($ETCD_VERSION), dmharness, hollownode into $bin"
  step "(a cold build takes long on few cores; log: $out/logs/k8s.log)"
  started=$SECONDS
  tmp="$out/.tmp-k8s"; rm -rf "$tmp"; mkdir -p "$tmp"
  vpkg=k8s.io/component-base/version
  minor=${k8s_minor_patch%%.*}
  ldflags="-s -w -X $vpkg.gitVersion=$K8S_VERSION -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor"
  ldflags="$ldflags -X $vpkg.gitTreeState=clean -X $vpkg.buildDate=1970-01-01T00:00:00Z"
  run_logged "$out/logs/k8s.log" "$GO" build -trimpath -ldflags="$ldflags" -o "$tmp/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler \
    go.etcd.io/etcd/server/v3 ./dmharness ./hollownode
  # `go build` names the etcd main package after its import path's last non-version element.
  mv "$tmp/server" "$bin/etcd"
  mv "$tmp/kube-apiserver" "$tmp/kube-scheduler" "$tmp/dmharness" "$tmp/hollownode" "$bin/"
  rmdir "$tmp"
  echo "$k8s_hash" >"$out/.stamp-k8s"
  step "built kube-apiserver kube-scheduler etcd dmharness hollownode in $((SECONDS - started))s"
fi

# Group 2: Volcano's scheduler and CRDs, from their own module.
vc_hash=$(inputs_hash versions.env volcano/go.mod volcano/go.sum)
if fresh "$out/.stamp-volcano" "$vc_hash" vc-scheduler && [ -d "$out/crd/volcano" ]; then
  step "vc-scheduler and Volcano CRDs: up to date in $out"
else
  step "building vc-scheduler (volcano.sh/volcano $VOLCANO_VERSION) into $bin (log: $out/logs/volcano.log)"
  started=$SECONDS
  (cd volcano && run_logged "$out/logs/volcano.log" "$GO" build -trimpath -ldflags="-s -w" \
    -o "$bin/vc-scheduler.tmp" volcano.sh/volcano/cmd/scheduler)
  mv "$bin/vc-scheduler.tmp" "$bin/vc-scheduler"
  vc_dir=$(mod_dir volcano volcano.sh/volcano)
  crd_src="$vc_dir/config/crd/volcano/bases"
  [ -d "$crd_src" ] || { echo "build.sh: Volcano CRDs not found at $crd_src" >&2; exit 1; }
  rm -rf "$out/crd/volcano"; mkdir -p "$out/crd/volcano"
  cp "$crd_src"/*.yaml "$out/crd/volcano/"
  chmod u+w "$out/crd/volcano"/*.yaml
  echo "$vc_hash" >"$out/.stamp-volcano"
  step "built vc-scheduler and copied $(ls "$out/crd/volcano" | wc -l) CRDs in $((SECONDS - started))s"
fi

cat >"$out/versions.env" <"$here/versions.env"
step "done in $((SECONDS - total_started))s: $out"

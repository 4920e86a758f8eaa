#!/usr/bin/env bash
# Builds the real counterparts the e2e tests start on loopback, once per machine. Components:
#   kubernetes  kube-apiserver, kube-scheduler (k8s.io/kubernetes), etcd (go.etcd.io/etcd/server/v3),
#               dmharness (ours: the kubelet's device manager behind a small HTTP API), hollownode (ours:
#               kubemark's hollow kubelet with the kubelet's real device manager) -- one `go build`
#   kube_controller_manager  kube-controller-manager from the same module (the Job controller makes a
#               batch Job's pods); its own component so that the one above stays as built
#   volcano     vc-scheduler and vc-controller-manager (volcano.sh/volcano, module in volcano/), Volcano's
#               CRDs (crd/volcano) and its JobFlow CRDs (crd/volcano-jobflow)
#   kuberay     kuberay-operator (github.com/ray-project/kuberay/ray-operator, module in kuberay/) and the
#               ray.io CRDs (crd/kuberay)
#   kueue       kueue-manager (sigs.k8s.io/kueue/cmd/kueue, module in kueue/), its CRDs (crd/kueue) and its
#               webhook configurations (crd/kueue-webhook/manifests.yaml, as published, service-based)
#   nvidia_device_plugin  NVIDIA's nvidia-device-plugin and gpu-feature-discovery
#               (github.com/NVIDIA/k8s-device-plugin, module in nvidia/), linked as NVIDIA links them: cgo
#               on, NVML symbols left for the dlopen'ed libnvidia-ml.so.1 (our C stand-in) to resolve
#
# Cache: each component is built into its own folder,
#   ${XDG_CACHE_HOME:-$HOME/.cache}/gpu-node-agent/components/<component>-<key>/{bin,crd,build.log}
# where <key> hashes only what that component is made from: its pins in versions.env, its module files
# (go.mod, go.sum), our sources it compiles, and its build recipe (the text of its build function below).
# Adding or changing another component's pin therefore rebuilds nothing else. The folder the tests read,
#   ${XDG_CACHE_HOME:-$HOME/.cache}/gpu-node-agent/<hash of versions.env>/{bin,crd}
# (agent/localcluster.py finds it by the same hash), holds symbolic links into the component folders and
# is rewritten on every run (cheap). Go's own caches stay where Go keeps them (go env GOCACHE GOMODCACHE).
#
#   build.sh              build what is missing; a second run builds nothing
#   build.sh --sync       rewrite every go.mod/go.sum from versions.env, then build
#   build.sh --print-dir  print the folder the tests read and exit
#   build.sh --print-keys print each component's cache folder name (<component>-<key>) and exit
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"

# shellcheck source=versions.env
source "$here/versions.env"
: "${K8S_VERSION:?versions.env must set K8S_VERSION}" "${ETCD_VERSION:?}" "${VOLCANO_VERSION:?}" \
  "${VOLCANO_APIS_VERSION:?}" "${KUBERAY_VERSION:?}" "${KUEUE_VERSION:?}" "${NVIDIA_DEVICE_PLUGIN_VERSION:?}"

cache="${XDG_CACHE_HOME:-$HOME/.cache}/gpu-node-agent"
components="$cache/components"
out="$cache/$(sha256sum "$here/versions.env" | cut -c1-16)"

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
mod_file() { "$GO" mod download -json "$1" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p'; }
go_directive() { awk '$1 == "go" {print $2; exit}' "$1"; }

# ------------------------------------------------------------------------------------------ --sync

sync_kubernetes() {
  step "sync go.mod: k8s.io/kubernetes $K8S_VERSION (staging modules $staging_version), etcd $ETCD_VERSION"
  local k8s_mod
  k8s_mod=$(mod_file "k8s.io/kubernetes@$K8S_VERSION")
  {
    echo "// Written by build.sh --sync from versions.env: change versions there, not here."
    echo "module gpu-node-agent/e2e/counterparts"
    echo
    echo "go $(go_directive "$k8s_mod")"
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
  vc_mod=$(mod_file "volcano.sh/volcano@$VOLCANO_VERSION")
  {
    echo "// Written by build.sh --sync from ../versions.env: change versions there, not here."
    echo "// A separate module because Volcano pins its own Kubernetes release."
    echo "module gpu-node-agent/e2e/counterparts/volcano"
    echo
    echo "go $(go_directive "$vc_mod")"
    echo
    echo "tool ("
    echo "	volcano.sh/volcano/cmd/controller-manager"
    echo "	volcano.sh/volcano/cmd/scheduler"
    echo ")"
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

# sync_plain DIR MODULE VERSION MAIN_PACKAGE...: a module of ours whose only requirement is MODULE, built as
# the MAIN_PACKAGEs. For upstream modules without replace directives (KubeRay's operator, Kueue, NVIDIA's
# device plugin); a module with replaces would need them copied, as sync_volcano does.
sync_plain() {
  local dir="$1" module="$2" version="$3" main
  shift 3
  step "sync $dir/go.mod: $module $version"
  local up_mod
  up_mod=$(mod_file "$module@$version")
  if grep -q '^replace\|=>' "$up_mod"; then
    echo "build.sh: $module@$version has replace directives; copy them as sync_volcano does" >&2; exit 1
  fi
  mkdir -p "$dir"
  {
    echo "// Written by build.sh --sync from ../versions.env: change versions there, not here."
    echo "// A separate module because $module pins its own Kubernetes libraries."
    echo "module gpu-node-agent/e2e/counterparts/$dir"
    echo
    echo "go $(go_directive "$up_mod")"
    echo
    if [ "$#" = 1 ]; then
      echo "tool $1"
    else
      echo "tool ("
      for main in "$@"; do echo "	$main"; done
      echo ")"
    fi
    echo
    echo "require $module $version"
  } >"$dir/go.mod"
  rm -f "$dir/go.sum"
  (cd "$dir" && run_logged "/tmp/gpu-node-agent-gomod-tidy-$dir.log" "$GO" mod tidy)
}

# go.mod files must say what versions.env says; otherwise ask for --sync instead of building something else.
require_in() {  # require_in GO_MOD WANT...
  local file="$1" got; shift
  got=$("$GO" mod edit -json "$file" | tr -d ' \n\t')
  for want in "$@"; do
    case "$got" in *"$want"*) ;; *)
      echo "build.sh: $here/$file does not match versions.env (missing $want); run: $0 --sync" >&2; exit 1;;
    esac
  done
}

check_pins() {
  require_in go.mod "\"Path\":\"k8s.io/kubernetes\",\"Version\":\"$K8S_VERSION\"" \
    "\"Path\":\"go.etcd.io/etcd/server/v3\",\"Version\":\"$ETCD_VERSION\"" \
    "\"New\":{\"Path\":\"k8s.io/api\",\"Version\":\"$staging_version\"}"
  require_in volcano/go.mod "\"Path\":\"volcano.sh/volcano\",\"Version\":\"$VOLCANO_VERSION\"" \
    "\"New\":{\"Path\":\"volcano.sh/apis\",\"Version\":\"$VOLCANO_APIS_VERSION\"}" \
    "\"Path\":\"volcano.sh/volcano/cmd/controller-manager\""
  require_in kuberay/go.mod \
    "\"Path\":\"github.com/ray-project/kuberay/ray-operator\",\"Version\":\"$KUBERAY_VERSION\""
  require_in kueue/go.mod "\"Path\":\"sigs.k8s.io/kueue\",\"Version\":\"$KUEUE_VERSION\""
  require_in nvidia/go.mod \
    "\"Path\":\"github.com/NVIDIA/k8s-device-plugin\",\"Version\":\"$NVIDIA_DEVICE_PLUGIN_VERSION\""
}

# ------------------------------------------------------------------------------------- components
# Each build_<component> DEST builds into DEST/bin (and DEST/crd); it runs inside $here. Its text is part
# of the component's cache key, so a changed recipe rebuilds that component only.

build_kubernetes() {
  local dest="$1"
  local vpkg=k8s.io/component-base/version
  local minor=${k8s_minor_patch%%.*}
  local ldflags="-s -w -X $vpkg.gitVersion=$K8S_VERSION -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor"
  ldflags="$ldflags -X $vpkg.gitTreeState=clean -X $vpkg.buildDate=1970-01-01T00:00:00Z"
  run_logged "$dest/build.log" "$GO" build -trimpath -ldflags="$ldflags" -o "$dest/bin/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler \
    go.etcd.io/etcd/server/v3 ./dmharness ./hollownode
  # `go build` names the etcd main package after its import path's last non-version element.
  mv "$dest/bin/server" "$dest/bin/etcd"
}

build_kube_controller_manager() {
  local dest="$1"
  local vpkg=k8s.io/component-base/version
  local minor=${k8s_minor_patch%%.*}
  local ldflags="-s -w -X $vpkg.gitVersion=$K8S_VERSION -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor"
  ldflags="$ldflags -X $vpkg.gitTreeState=clean -X $vpkg.buildDate=1970-01-01T00:00:00Z"
  run_logged "$dest/build.log" "$GO" build -trimpath -ldflags="$ldflags" -o "$dest/bin/kube-controller-manager" \
    k8s.io/kubernetes/cmd/kube-controller-manager
}

build_volcano() {
  local dest="$1"
  # One `go build` for both: the controller manager shares most packages with the scheduler.
  (cd volcano && run_logged "$dest/build.log" "$GO" build -trimpath -ldflags="-s -w" -o "$dest/bin/" \
    volcano.sh/volcano/cmd/scheduler volcano.sh/volcano/cmd/controller-manager)
  mv "$dest/bin/scheduler" "$dest/bin/vc-scheduler"
  mv "$dest/bin/controller-manager" "$dest/bin/vc-controller-manager"
  local src
  src=$(mod_dir volcano volcano.sh/volcano)
  copy_yaml "$src/config/crd/volcano/bases" "$dest/crd/volcano"
  copy_yaml "$src/config/crd/jobflow/bases" "$dest/crd/volcano-jobflow"
}

build_kuberay() {
  local dest="$1"
  (cd kuberay && run_logged "$dest/build.log" "$GO" build -trimpath -ldflags="-s -w" \
    -o "$dest/bin/kuberay-operator" github.com/ray-project/kuberay/ray-operator)
  copy_yaml "$(mod_dir kuberay github.com/ray-project/kuberay/ray-operator)/config/crd/bases" "$dest/crd/kuberay"
}

build_kueue() {
  local dest="$1"
  (cd kueue && run_logged "$dest/build.log" "$GO" build -trimpath -ldflags="-s -w" \
    -o "$dest/bin/kueue-manager" sigs.k8s.io/kueue/cmd/kueue)
  local src
  src=$(mod_dir kueue sigs.k8s.io/kueue)
  copy_yaml "$src/config/components/crd/bases" "$dest/crd/kueue"
  mkdir -p "$dest/crd/kueue-webhook"
  cp "$src/config/components/webhook/manifests.yaml" "$dest/crd/kueue-webhook/manifests.yaml"
  chmod u+w "$dest/crd/kueue-webhook/manifests.yaml"
}

build_nvidia_device_plugin() {
  local dest="$1"
  # go-nvml reaches NVML through cgo: every nvml* symbol stays undefined in the binary and is resolved,
  # lazily at its first call, from the libnvidia-ml.so.1 that go-nvml dlopens (RTLD_GLOBAL). NVIDIA's
  # Makefile links with the same flags; the version is stamped where its Makefile stamps it.
  local info=github.com/NVIDIA/k8s-device-plugin/internal/info
  local ldflags="-s -w -X $info.version=$NVIDIA_DEVICE_PLUGIN_VERSION"
  ldflags="$ldflags '-extldflags=-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files'"
  (cd nvidia && CGO_ENABLED=1 run_logged "$dest/build.log" "$GO" build -trimpath -ldflags="$ldflags" \
    -o "$dest/bin/" github.com/NVIDIA/k8s-device-plugin/cmd/nvidia-device-plugin \
    github.com/NVIDIA/k8s-device-plugin/cmd/gpu-feature-discovery)
}

copy_yaml() {  # copy_yaml FROM TO: every *.yaml of FROM (module files are read-only) into TO
  [ -d "$1" ] || { echo "build.sh: no CRD folder at $1" >&2; exit 1; }
  mkdir -p "$2"
  cp "$1"/*.yaml "$2/"
  chmod u+w "$2"/*.yaml
}

# What each component is made from, besides its recipe: pins, then files (relative to $here).
inputs_kubernetes() { echo "K8S_VERSION=$K8S_VERSION ETCD_VERSION=$ETCD_VERSION"; cat go.mod go.sum dmharness/*.go hollownode/*.go; }
inputs_kube_controller_manager() { echo "K8S_VERSION=$K8S_VERSION"; cat go.mod go.sum; }
inputs_volcano() { echo "VOLCANO_VERSION=$VOLCANO_VERSION VOLCANO_APIS_VERSION=$VOLCANO_APIS_VERSION"; cat volcano/go.mod volcano/go.sum; }
inputs_kuberay() { echo "KUBERAY_VERSION=$KUBERAY_VERSION"; cat kuberay/go.mod kuberay/go.sum; }
inputs_kueue() { echo "KUEUE_VERSION=$KUEUE_VERSION"; cat kueue/go.mod kueue/go.sum; }
inputs_nvidia_device_plugin() {
  echo "NVIDIA_DEVICE_PLUGIN_VERSION=$NVIDIA_DEVICE_PLUGIN_VERSION"; cat nvidia/go.mod nvidia/go.sum
}

binaries_kubernetes="kube-apiserver kube-scheduler etcd dmharness hollownode"
binaries_kube_controller_manager="kube-controller-manager"
binaries_volcano="vc-scheduler vc-controller-manager"
binaries_kuberay="kuberay-operator"
binaries_kueue="kueue-manager"
binaries_nvidia_device_plugin="nvidia-device-plugin gpu-feature-discovery"

COMPONENTS="kubernetes volcano kuberay kueue kube_controller_manager nvidia_device_plugin"

component_key() {
  { "inputs_$1"; declare -f "build_$1" copy_yaml run_logged; } | sha256sum | cut -c1-16
}

# Binaries of the kubernetes group that the previous layout (one folder per hash of the whole
# versions.env, stamped with a hash of versions.env + go.mod + go.sum + our sources) built from exactly
# today's go.mod, go.sum and sources, with the same recipe: taken over instead of rebuilt (~20 min).
adopt_previous_kubernetes() {
  local dest="$1" old stamp version
  for old in "$cache"/*/; do
    old=${old%/}
    [ -f "$old/.stamp-k8s" ] && [ -f "$old/versions.env" ] || continue
    version=$(sed -n 's/^K8S_VERSION=//p' "$old/versions.env")
    [ "$version" = "$K8S_VERSION" ] || continue
    stamp=$(cat "$old/versions.env" go.mod go.sum dmharness/*.go hollownode/*.go | sha256sum | cut -c1-16)
    [ "$stamp" = "$(cat "$old/.stamp-k8s")" ] || continue
    local b ok=1
    for b in $binaries_kubernetes; do [ -x "$old/bin/$b" ] && [ ! -L "$old/bin/$b" ] || ok=0; done
    [ "$ok" = 1 ] || continue
    mkdir -p "$dest/bin"
    for b in $binaries_kubernetes; do cp -l "$old/bin/$b" "$dest/bin/$b" 2>/dev/null || cp "$old/bin/$b" "$dest/bin/$b"; done
    echo "taken over from $old (built from the same go.mod, go.sum and sources)" >"$dest/build.log"
    step "kubernetes: binaries built earlier from the same inputs taken over from $old"
    return 0
  done
  return 1
}

# ensure COMPONENT: the component's folder, built if missing; prints nothing else on stdout.
ensure() {
  local name="$1" key dir tmp started b
  key=$(component_key "$name")
  dir="$components/$name-$key"
  local bins_var="binaries_$name"
  if [ -f "$dir/.complete" ]; then
    for b in ${!bins_var}; do [ -x "$dir/bin/$b" ] || rm -f "$dir/.complete"; done
  fi
  if [ -f "$dir/.complete" ]; then
    step "$name: up to date ($dir)" >&2
  else
    tmp="$dir.tmp"
    rm -rf "$tmp"; mkdir -p "$tmp/bin"
    if ! { [ "$name" = kubernetes ] && adopt_previous_kubernetes "$tmp" >&2; }; then
      step "$name: building ${!bins_var} (log: $dir/build.log; a cold build takes minutes on few cores)" >&2
      started=$SECONDS
      "build_$name" "$tmp"
      step "$name: built in $((SECONDS - started))s" >&2
    fi
    for b in ${!bins_var}; do
      [ -x "$tmp/bin/$b" ] || { echo "build.sh: $name: $b was not produced (see $tmp/build.log)" >&2; exit 1; }
    done
    touch "$tmp/.complete"
    rm -rf "$dir"; mv "$tmp" "$dir"
  fi
  echo "$dir"
}

if [ "${1:-}" = "--print-keys" ]; then  # each component's cache folder name; builds nothing
  for name in $COMPONENTS; do echo "$name-$(component_key "$name")"; done
  exit 0
fi

if [ "${1:-}" = "--sync" ]; then
  "$GO" mod download "k8s.io/kubernetes@$K8S_VERSION"
  sync_kubernetes
  sync_volcano
  sync_plain kuberay github.com/ray-project/kuberay/ray-operator "$KUBERAY_VERSION" \
    github.com/ray-project/kuberay/ray-operator
  sync_plain kueue sigs.k8s.io/kueue "$KUEUE_VERSION" sigs.k8s.io/kueue/cmd/kueue
  sync_plain nvidia github.com/NVIDIA/k8s-device-plugin "$NVIDIA_DEVICE_PLUGIN_VERSION" \
    github.com/NVIDIA/k8s-device-plugin/cmd/gpu-feature-discovery \
    github.com/NVIDIA/k8s-device-plugin/cmd/nvidia-device-plugin
elif [ -n "${1:-}" ]; then
  echo "build.sh: unknown argument '$1' (use --sync, --print-dir or --print-keys)" >&2; exit 2
fi

check_pins
mkdir -p "$components" "$out/bin" "$out/crd"
export CGO_ENABLED=0
total_started=$SECONDS

# The tests' folder: links to each component's binaries and CRD folders.
link() {  # link COMPONENT_DIR
  local f d
  for f in "$1"/bin/*; do ln -sfn "$f" "$out/bin/$(basename "$f")"; done
  if [ -d "$1/crd" ]; then
    for d in "$1"/crd/*/; do d=${d%/}; rm -rf "${out:?}/crd/$(basename "$d")"; ln -sfn "$d" "$out/crd/$(basename "$d")"; done
  fi
}
# Components already built are linked first, so that what exists is usable while the rest builds.
for name in $COMPONENTS; do
  dir="$components/$name-$(component_key "$name")"
  if [ -f "$dir/.complete" ]; then link "$dir"; fi
done
for name in $COMPONENTS; do
  link "$(ensure "$name")"
done
cp "$here/versions.env" "$out/versions.env"
step "done in $((SECONDS - total_started))s: $out"

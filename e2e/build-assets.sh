#!/usr/bin/env bash
# Builds kube-apiserver and etcd from their Go modules (pinned in e2e/assets/go.mod) into a cache
# folder keyed by their versions, and prints that folder: the value for KUBEBUILDER_ASSETS.
#
#   export KUBEBUILDER_ASSETS="$(e2e/build-assets.sh)"
#
# A second run finds the binaries and only prints the folder. Progress goes to stderr.
# WORKQUEUE_E2E_ASSETS_CACHE overrides the cache root (default: $XDG_CACHE_HOME or ~/.cache).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/assets"

# The versions, read from go.mod so that there is one place to change them.
kube_version="$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2; exit }' go.mod)"
etcd_version="$(awk '$1 == "go.etcd.io/etcd/server/v3" && $2 ~ /^v/ { print $2; exit }' go.mod)"
go_version="$(go env GOVERSION)"
cache_root="${WORKQUEUE_E2E_ASSETS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/workqueue-e2e}"
out="$cache_root/kube-$kube_version-etcd-$etcd_version-$go_version"

if [ -x "$out/kube-apiserver" ] && [ -x "$out/etcd" ]; then
  echo "$out"
  exit 0
fi

echo "building kube-apiserver $kube_version and etcd $etcd_version with $go_version into $out" >&2
mkdir -p "$out"
tmp="$(mktemp -d "$out/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

# Upstream's version stamps (hack/lib/version.sh), so that /version reports the real version.
minor="${kube_version#v1.}"
minor="${minor%%.*}"
kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ldflags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  kube_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

export CGO_ENABLED=0
# -mod=mod: go.sum is committed and verified; nothing is vendored.
GOFLAGS=-mod=mod go build -trimpath -tags selinux,notest,grpcnotrace -ldflags "$kube_ldflags" \
  -o "$tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3

# Moved in only once both are built: a half-built folder is never taken for a finished one.
mv "$tmp/kube-apiserver" "$tmp/etcd" "$out/"
echo "$out"

#!/usr/bin/env bash
# Build kube-apiserver, kube-controller-manager and kubectl 1.20.2 once, offline, from Debian
# bookworm's `kubernetes` SOURCE package, into a cache the operator tests start them from.
#
# Why from source: no Docker engine runs here (kind cannot), no Go proxy or GitHub downloads are
# reachable, but Debian's source package is the whole upstream tree with vendor/, and Debian's Go
# builds it in GOPATH mode. Two fixes are needed (see ../shared NOTES, section Kubernetes):
#   * `make gen_openapi` first: the generated OpenAPI file is not in the tarball;
#   * vendor/github.com/modern-go/reflect2 1.0.1 segfaults on Go >= 1.18 at the first
#     custom-resource create: replace it with Debian's golang-github-modern-go-reflect2-dev.
#
# Usage: tests/harness/build_kube.sh          build when missing, print the binaries' directory
#        tests/harness/build_kube.sh --check  exit 0 when the binaries are cached, 1 otherwise
# Cache: ${KAFSCALE_KUBE_CACHE:-~/.cache/kafscale/kube-1.20.2}/<Debian source version>-r<recipe>/bin
# Takes 5-9 minutes on 2 cores and ~1.5 GB of scratch space (removed afterwards).
#
# A killed build leaves nothing running: the long steps (apt-get source, make gen_openapi, go
# build) run through `bound_in`, and end, with everything they started, when this script ends,
# however it ends (SIGTERM, Ctrl-C, or SIGKILL: pytest's children get that when pytest dies).
# A build dir a SIGKILLed build could not remove is removed by the next build.
set -euo pipefail

KUBE_VERSION=1.20.2
DEB_SOURCE_VERSION=1.20.5+really1.20.2-1.1+deb12u1  # bookworm(-security) source; the cache key
RECIPE=3  # bump when this script builds differently: the cache key changes with it
CACHE_ROOT="${KAFSCALE_KUBE_CACHE:-$HOME/.cache/kafscale/kube-$KUBE_VERSION}"
OUT="$CACHE_ROOT/$DEB_SOURCE_VERSION-r$RECIPE/bin"
BINARIES=(kube-apiserver kube-controller-manager kubectl)
APT_PACKAGES=(golang-go rsync dpkg-dev golang-github-modern-go-reflect2-dev)
DEB_SRC_LIST=/etc/apt/sources.list.d/kafscale-deb-src.sources
REFLECT2_SRC=/usr/share/gocode/src/github.com/modern-go/reflect2

log() { echo "build_kube: $*" >&2; }

cached() {
    local b
    for b in "${BINARIES[@]}"; do [ -x "$OUT/$b" ] || return 1; done
}

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

# deb-src twins of apt's deb entries (deb822 or one-line format), so `apt-get source` works.
add_deb_src() {
    if apt-cache showsrc kubernetes 2>/dev/null | grep -q '^Version: .*1\.20\.2'; then
        return
    fi
    log "adding deb-src entries ($DEB_SRC_LIST) and running apt-get update"
    local tmp
    tmp="$(mktemp)"
    {
        for f in /etc/apt/sources.list.d/*.sources; do
            [ -f "$f" ] && [ "$f" != "$DEB_SRC_LIST" ] && sed -n '/^Types:.*\bdeb\b/,/^$/p' "$f" \
                | sed 's/^Types:.*/Types: deb-src/'
            echo
        done
        if [ -f /etc/apt/sources.list ]; then
            grep -E '^deb ' /etc/apt/sources.list | sed 's/^deb /deb-src /' | while read -r line; do
                # one-line entries: deb-src URI SUITE COMPONENTS -> deb822 stanza
                set -- $line
                printf 'Types: deb-src\nURIs: %s\nSuites: %s\nComponents: %s\n\n' "$2" "$3" "${*:4}"
            done
        fi
    } >"$tmp"
    as_root install -m 0644 "$tmp" "$DEB_SRC_LIST"
    rm -f "$tmp"
    as_root apt-get update -qq
}

# Not a bound step: a dpkg killed half way leaves the package database to repair.
install_apt_packages() {
    local missing=() p
    for p in "${APT_PACKAGES[@]}"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing ${missing[*]}"
        as_root apt-get update -qq
        DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends \
            "${missing[@]}" >/dev/null
    fi
}

BUILD_DIR=""
cleanup() { [ -z "$BUILD_DIR" ] || rm -rf "$BUILD_DIR"; }

# A long step runs in a process group (and session) of its own, led by a small bash that starts
# it and, told to stop with SIGTERM, kills the whole group: the step and what it forked (go
# build's compile and link processes, make's generators), which a signal to the step alone
# would leave running. The leader gets that SIGTERM from stop_step (this script trapped a
# signal) or from the kernel when this script dies, even by SIGKILL (setpriv --pdeathsig):
# a trap cannot run then, and under bash a killed script's foreground child just runs on.
STEP_LEADER='trap "kill -KILL 0" TERM; cd "$1" || exit; shift; "$@" & wait "$!"'
STEP_PID=""

# bound_in DIR CMD...: run CMD in DIR as such a step and return its exit status.
bound_in() {
    setpriv --pdeathsig TERM -- setsid bash -c "$STEP_LEADER" step "$@" &
    STEP_PID=$!
    local status=0
    wait "$STEP_PID" || status=$?
    STEP_PID=""
    return "$status"
}

# Kill the running step's whole process group and wait (briefly) until it is gone, so that
# cleanup does not remove a tree something still writes into.
stop_step() {
    [ -n "$STEP_PID" ] || return 0
    kill -KILL -- "-$STEP_PID" 2>/dev/null || true
    wait "$STEP_PID" 2>/dev/null || true
    local i
    for i in $(seq 50); do
        kill -0 -- "-$STEP_PID" 2>/dev/null || break
        sleep 0.1
    done
    STEP_PID=""
}

# While `wait` runs (not a foreground child) a trapped signal is handled at once.
trap_signals() {
    trap 'stop_step; cleanup' EXIT
    trap 'exit 129' HUP
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

# A build killed by SIGKILL runs no trap: its tree and Go cache (~2 GB) stay. Builds take the
# lock below one at a time, so while it is held every build dir is such a leftover.
remove_abandoned_builds() {
    local dir
    for dir in "$CACHE_ROOT"/*/build.*; do
        [ -d "$dir" ] || continue
        log "removing $dir (left by a build that was killed)"
        rm -rf "$dir"
    done
}

build() {
    local work="$CACHE_ROOT/$DEB_SOURCE_VERSION-r$RECIPE/build.$$"
    BUILD_DIR="$work"  # the tree and Go's cache take ~2 GB: cleanup removes them
    rm -rf "$work"
    mkdir -p "$work"
    log "fetching the kubernetes $DEB_SOURCE_VERSION source package into $work"
    # the security archive keeps only its newest upload: when this one is gone, build that
    # (the same upstream 1.20.2 with Debian's later patches) into this cache key, and say so
    bound_in "$work" apt-get source -qq "kubernetes=$DEB_SOURCE_VERSION" >/dev/null || {
        log "kubernetes=$DEB_SOURCE_VERSION is gone from the archive; building the newest source"
        bound_in "$work" apt-get source -qq kubernetes >/dev/null
    }
    local src
    src="$(find "$work" -maxdepth 1 -type d -name 'kubernetes-*' | head -n1)"
    [ -n "$src" ] || { log "apt-get source gave no kubernetes-* directory"; exit 1; }

    export GOPATH="$work/gopath" GOCACHE="$work/gocache"
    export GO111MODULE=off GOPROXY=off CGO_ENABLED=0
    mkdir -p "$GOPATH/src/k8s.io"
    ln -s "$src" "$GOPATH/src/k8s.io/kubernetes"
    local tree="$GOPATH/src/k8s.io/kubernetes"

    log "replacing vendored reflect2 with Debian's (the vendored one crashes on Go >= 1.18)"
    rm -rf "$tree/vendor/github.com/modern-go/reflect2"
    cp -r "$REFLECT2_SRC" "$tree/vendor/github.com/modern-go/reflect2"

    # Built with Go >= 1.18, the vendored OpenAPI type validator takes every zero value ("", 0,
    # false) for null (it compares two reflect.Values with DeepEqual), so the server refuses
    # `default: ''` and any empty string in a custom resource. Upstream kube-openapi later
    # checks `data == nil` only, which is what the Go 1.15 build of 1.20.2 did in effect.
    log "patching the OpenAPI type validator's zero-value check (Go >= 1.18)"
    local file
    for file in vendor/k8s.io/kube-openapi/pkg/validation/validate/type.go \
                vendor/github.com/go-openapi/validate/type.go; do
        grep -q 'reflect.DeepEqual(reflect.Zero(reflect.TypeOf(data)), reflect.ValueOf(data))' \
            "$tree/$file" || { log "$file: the zero-value check is not where expected"; exit 1; }
        sed -i 's/data == nil || reflect.DeepEqual(reflect.Zero(reflect.TypeOf(data)), reflect.ValueOf(data))/data == nil/' \
            "$tree/$file"
    done

    log "generating the OpenAPI definitions (make gen_openapi)"
    bound_in "$tree" make gen_openapi >"$work/gen_openapi.log" 2>&1 \
        || { tail -40 "$work/gen_openapi.log" >&2; exit 1; }

    # The version stamps hack/lib/version.sh would set, in both packages that carry them:
    # kubectl reads component-base's, the API server's /version answers client-go's.
    local ldflags="-s -w" pkg
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        pkg="k8s.io/kubernetes/vendor/$pkg"
        ldflags="$ldflags -X $pkg.gitVersion=v$KUBE_VERSION -X $pkg.gitMajor=1"
        ldflags="$ldflags -X $pkg.gitMinor=20 -X $pkg.gitTreeState=clean"
        ldflags="$ldflags -X $pkg.buildDate=2021-01-13T13:20:00Z"
    done
    mkdir -p "$work/bin"
    local b
    for b in "${BINARIES[@]}"; do
        log "go build $b"
        bound_in "$tree" go build -o "$work/bin/$b" -ldflags "$ldflags" "k8s.io/kubernetes/cmd/$b"
    done
    "$work/bin/kubectl" version --client --short >&2 || "$work/bin/kubectl" version --client >&2
    rm -rf "$OUT"
    mv "$work/bin" "$OUT"  # atomic: a reader never sees half the binaries
}

main() {
    if [ "${1:-}" = "--check" ]; then
        cached
        return
    fi
    trap_signals
    mkdir -p "$CACHE_ROOT"
    exec 9>"$CACHE_ROOT/.lock"
    flock 9  # two `make test` runs at once: one builds, the other waits and reuses
    remove_abandoned_builds
    if ! cached; then
        log "building Kubernetes $KUBE_VERSION binaries (one time, 5-9 minutes)"
        install_apt_packages
        add_deb_src
        build
        log "done: $OUT"
    fi
    echo "$OUT"
}

# Sourced (a test of the functions above), it defines them and runs nothing.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    main "$@"
fi

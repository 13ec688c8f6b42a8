#!/usr/bin/env bash
# Prepare a checkout for tests: .venv with the project installed editable (plus the `test` and
# `spark` extras), the Toxiproxy server and helm binaries in .ci/bin/, a Java runtime for PySpark, and the wire
# tier's client programs (tests/wire: Maven- and Go-built, dependencies cached in ~/.m2 and the
# Go module cache).
#
# Idempotent and quick when nothing changed (no network then). Works as root on a fresh
# Debian 12 machine with no stdin (CI=true): missing prerequisites (python3-venv, a Go that can
# build Toxiproxy) are installed only when absent. Prints one line per action.
#
#   bash .ci/setup.sh
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO/.venv"
CI_BIN="$REPO/.ci/bin"
INSTALL_STAMP="$VENV/.dledger-install.sha256"

TOXIPROXY_MODULE="github.com/Shopify/toxiproxy/v2"
TOXIPROXY_VERSION="v2.12.0"            # needs go >= 1.23 (its go.mod says `go 1.23.0`)
TOXIPROXY_BIN="$CI_BIN/toxiproxy-server"
TOXIPROXY_STAMP="$CI_BIN/toxiproxy-server.version"
# Helm (issue 27: the chart under docker/helm/dledger-mq, checked with `helm lint` / `helm template`
# by tests/test_helm_chart.py), built from the Go module proxy like Toxiproxy.
HELM_MODULE="helm.sh/helm/v3"
HELM_VERSION="v3.22.0"
HELM_BIN="$CI_BIN/helm"
HELM_STAMP="$CI_BIN/helm.version"
# Used only when no Go >= 1.21 is installed: fetched as the golang.org/toolchain module (what
# GOTOOLCHAIN=auto does itself), checked against sum.golang.org, unpacked into .ci/go/.
GO_BOOTSTRAP_VERSION="1.23.12"
GO_LOCAL="$REPO/.ci/go"

# Top-level packages the build's find-include may pick up (see pyproject.toml).
PACKAGE_DIRS=(dledger broker namesrv chaos spark_jobs)

log() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: ERROR: %s\n' "$*" >&2; exit 1; }

# Run a command with its output captured; show the output only if it fails.
quietly() {
    local out rc=0
    out="$(mktemp)"
    "$@" >"$out" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ]; then
        cat "$out" >&2
        rm -f "$out"
        die "failed (exit $rc): $*"
    fi
    rm -f "$out"
}

# ---------------------------------------------------------------------------------------------
# apt_install PKG...: install Debian packages that are not installed yet; `apt-get update` runs
# at most once per setup run. Later issues add their system packages through this function.
# ---------------------------------------------------------------------------------------------
APT_UPDATED=0
apt_install() {
    local missing=() pkg
    for pkg in "$@"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    [ "${#missing[@]}" -eq 0 ] && return 0
    command -v apt-get >/dev/null || die "need packages ${missing[*]} but apt-get is not available"
    [ "$(id -u)" -eq 0 ] || die "need packages ${missing[*]}: run as root or install them first"
    if [ "$APT_UPDATED" -eq 0 ]; then
        log "apt-get update"
        quietly env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        APT_UPDATED=1
    fi
    log "apt-get install ${missing[*]}"
    quietly env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# What the editable install depends on: pyproject.toml, and which top-level packages exist
# (setuptools' editable finder only maps packages present at install time).
install_fingerprint() {
    local dirs=() d
    for d in "${PACKAGE_DIRS[@]}"; do
        [ -f "$REPO/$d/__init__.py" ] && dirs+=("$d")
    done
    printf '%s %s\n' "$(sha256_of "$REPO/pyproject.toml")" "${dirs[*]}"
}

# ---------------------------------------------------------------------------------------------
ensure_python() {
    if ! command -v python3 >/dev/null || ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
        apt_install python3 python3-venv
    fi
    python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
        || die "python3 is $(python3 -V 2>&1); the project needs >= 3.11"
}

ensure_venv() {
    if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
        return 0
    fi
    [ -e "$VENV" ] && { log "removing broken $VENV"; rm -rf "$VENV"; }
    log "creating $VENV with $(python3 -V 2>&1)"
    quietly python3 -m venv "$VENV"
}

ensure_project_installed() {
    local want have=""
    want="$(install_fingerprint)"
    [ -f "$INSTALL_STAMP" ] && have="$(cat "$INSTALL_STAMP")"
    if [ "$want" = "$have" ]; then
        log "project already installed in .venv (pyproject.toml unchanged)"
        return 0
    fi
    export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
    log "upgrading pip"
    quietly "$VENV/bin/python" -m pip install -q --upgrade pip
    log "pip install -e '.[test,spark]'"
    quietly "$VENV/bin/python" -m pip install -q -e "$REPO[test,spark]"
    printf '%s\n' "$want" >"$INSTALL_STAMP"
}

# ---------------------------------------------------------------------------------------------
go_minor() { # prints the minor version of the go at $1 (go1.N[.x] -> N), or nothing
    "$1" env GOVERSION 2>/dev/null | sed -n 's/^go1\.\([0-9]*\).*/\1/p'
}

# Sets GO to a go command that can build Toxiproxy $TOXIPROXY_VERSION.
ensure_go() {
    local candidate minor
    for candidate in "$(command -v go || true)" /usr/local/go/bin/go "$GO_LOCAL/bin/go"; do
        [ -n "$candidate" ] && [ -x "$candidate" ] || continue
        minor="$(go_minor "$candidate")"
        # >= 1.21 fetches a newer toolchain on its own when a module needs one (GOTOOLCHAIN=auto).
        if [ -n "$minor" ] && [ "$minor" -ge 21 ] && [ -z "${DLEDGER_CI_FORCE_GO_BOOTSTRAP:-}" ]; then
            GO="$candidate"
            return 0
        fi
    done
    bootstrap_go
    GO="$GO_LOCAL/bin/go"
}

bootstrap_go() {
    local old_go arch module dir tmp
    old_go="$(command -v go || true)"
    if [ -z "$old_go" ]; then
        # Debian 12 ships go 1.19: too old for Toxiproxy, but able to fetch a newer toolchain.
        apt_install golang-go ca-certificates
        old_go="$(command -v go)"
    fi
    arch="$("$old_go" env GOHOSTARCH)"
    module="golang.org/toolchain@v0.0.1-go${GO_BOOTSTRAP_VERSION}.linux-${arch}"
    log "bootstrapping go ${GO_BOOTSTRAP_VERSION} into .ci/go (module $module, checked by sum.golang.org)"
    # Run outside any module so that no go.mod around the caller takes part.
    tmp="$(mktemp -d)"
    dir="$(cd "$tmp" && GOTOOLCHAIN=local "$old_go" mod download -json "$module" \
        | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')" || dir=""
    rmdir "$tmp"
    [ -n "$dir" ] && [ -f "$dir/bin/go" ] || die "could not download $module"
    rm -rf "$GO_LOCAL" "$GO_LOCAL.tmp"
    cp -r "$dir" "$GO_LOCAL.tmp"
    chmod -R u+w "$GO_LOCAL.tmp"
    # Module zips carry no file modes; make the toolchain's programs executable again.
    find "$GO_LOCAL.tmp/bin" "$GO_LOCAL.tmp/pkg/tool" -type f -exec chmod +x {} +
    mv "$GO_LOCAL.tmp" "$GO_LOCAL"
}

ensure_toxiproxy() {
    if [ -x "$TOXIPROXY_BIN" ] && [ "$(cat "$TOXIPROXY_STAMP" 2>/dev/null)" = "$TOXIPROXY_VERSION" ]; then
        log "toxiproxy-server $TOXIPROXY_VERSION already built in .ci/bin"
        return 0
    fi
    ensure_go
    log "go install $TOXIPROXY_MODULE/cmd/server@$TOXIPROXY_VERSION with $("$GO" env GOVERSION) -> .ci/bin/toxiproxy-server"
    mkdir -p "$CI_BIN"
    rm -f "$CI_BIN/server"
    quietly env GOBIN="$CI_BIN" CGO_ENABLED=0 GOTOOLCHAIN="${GOTOOLCHAIN:-auto}" \
        "$GO" install "$TOXIPROXY_MODULE/cmd/server@$TOXIPROXY_VERSION"
    mv -f "$CI_BIN/server" "$TOXIPROXY_BIN"
    printf '%s\n' "$TOXIPROXY_VERSION" >"$TOXIPROXY_STAMP"
}

ensure_helm() {
    if [ -x "$HELM_BIN" ] && [ "$(cat "$HELM_STAMP" 2>/dev/null)" = "$HELM_VERSION" ]; then
        log "helm $HELM_VERSION already built in .ci/bin"
        return 0
    fi
    ensure_go
    log "go install $HELM_MODULE/cmd/helm@$HELM_VERSION with $("$GO" env GOVERSION) -> .ci/bin/helm"
    mkdir -p "$CI_BIN"
    quietly env GOBIN="$CI_BIN" CGO_ENABLED=0 GOTOOLCHAIN="${GOTOOLCHAIN:-auto}" \
        "$GO" install "$HELM_MODULE/cmd/helm@$HELM_VERSION"
    printf '%s\n' "$HELM_VERSION" >"$HELM_STAMP"
}

# PySpark (the audits) runs on a Java 17+ runtime.
ensure_java() {
    local v=""
    if command -v java >/dev/null; then
        v="$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)"
    fi
    if [ -n "$v" ] && [ "$v" -ge 17 ]; then
        return 0
    fi
    apt_install openjdk-17-jre-headless
}

# The dashboard's browser test (tests/broker/tools/test_dashboard_browser.py) drives Debian's
# headless Chromium through its chromedriver (selenium, from the `test` extra).
ensure_chromium() {
    apt_install chromium chromium-driver
}

# ---------------------------------------------------------------------------------------------
# The wire tier (tests/wire, issue 25): the official RocketMQ clients' programs. Maven resolves
# rocketmq-client/-acl 4.9.8 and 5.3.1 and rocketmq-tools 4.9.8 into ~/.m2 and compiles our scenario
# runner; the Go module proxy serves rocketmq-client-go/v2 into the module cache. Each build is
# stamped with a hash of its sources, so a later run with nothing changed is offline and quick.
WIRE_DIR="$REPO/tests/wire"
WIRE_JAVA="$WIRE_DIR/java"
WIRE_GO="$WIRE_DIR/go"
WIRE_PROFILES=(rmq4 rmq5 admin4)

wire_java_fingerprint() {
    (cd "$WIRE_JAVA" && find pom.xml src -type f -print0 | sort -z | xargs -0 sha256sum) | sha256sum | cut -d' ' -f1
}

wire_go_fingerprint() {
    (cd "$WIRE_GO" && find . -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) -print0 | sort -z \
        | xargs -0 sha256sum; "$GO" env GOVERSION) | sha256sum | cut -d' ' -f1
}

ensure_maven() {
    command -v mvn >/dev/null && command -v javac >/dev/null && return 0
    apt_install maven openjdk-17-jdk-headless
}

ensure_wire_java() {
    local want stamp="$WIRE_JAVA/target/.wire-build.sha256" p ok=1
    ensure_maven
    want="$(wire_java_fingerprint)"
    for p in "${WIRE_PROFILES[@]}"; do
        [ -s "$WIRE_JAVA/target/$p.cp" ] && [ -d "$WIRE_JAVA/target/$p/classes" ] || ok=0
    done
    if [ "$ok" -eq 1 ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
        log "wire tier: Java programs already built (tests/wire/java unchanged)"
        return 0
    fi
    for p in "${WIRE_PROFILES[@]}"; do
        log "wire tier: mvn -P$p package dependency:build-classpath (rocketmq $(case $p in rmq5) echo 5.3.1 client;; admin4) echo 4.9.8 tools;; *) echo 4.9.8 client;; esac))"
        rm -f "$WIRE_JAVA/target/$p.cp"
        quietly mvn -f "$WIRE_JAVA/pom.xml" -B -q -Dstyle.color=never "-P$p" -DskipTests \
            package dependency:build-classpath "-Dmdep.outputFile=$WIRE_JAVA/target/$p.cp"
        [ -s "$WIRE_JAVA/target/$p.cp" ] || die "mvn -P$p wrote no classpath"
    done
    printf '%s\n' "$want" >"$stamp"
}

ensure_wire_go() {
    local want stamp="$WIRE_DIR/.build/wirego.sha256" bin="$WIRE_DIR/.build/wirego"
    ensure_go
    want="$(wire_go_fingerprint)"
    if [ -x "$bin" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
        log "wire tier: Go client program already built (tests/wire/go unchanged)"
        return 0
    fi
    log "wire tier: go build tests/wire/go (rocketmq-client-go/v2 from go.mod) -> tests/wire/.build/wirego"
    mkdir -p "$WIRE_DIR/.build"
    (cd "$WIRE_GO" && quietly env CGO_ENABLED=0 GOTOOLCHAIN="${GOTOOLCHAIN:-auto}" GOFLAGS="-mod=readonly -buildvcs=false" \
        "$GO" build -o "$bin" .)
    printf '%s\n' "$want" >"$stamp"
}

# ---------------------------------------------------------------------------------------------
main() {
    cd "$REPO"
    mkdir -p "$REPO/.ci"
    # Concurrent runs (several shells testing one checkout) would race on .venv and .ci/bin.
    if command -v flock >/dev/null; then
        exec 9>"$REPO/.ci/.setup.lock"
        flock -w 900 9 || die "another setup.sh has held .ci/.setup.lock for 15 minutes"
    fi
    ensure_python
    ensure_venv
    ensure_project_installed
    ensure_toxiproxy
    ensure_helm
    ensure_java
    ensure_chromium
    ensure_wire_java
    ensure_wire_go
    log "ready: $VENV, $TOXIPROXY_BIN, $HELM_BIN, java $(java -version 2>&1 | head -1), wire tier programs"
}

main "$@"

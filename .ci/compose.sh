#!/usr/bin/env bash
# The docker compose cluster (two NameServers + one 3-broker DLedger group; with the profile
# "fleet" three groups), offline-capable.
#
#   bash .ci/compose.sh up        # engine, base image, wheels, image, `compose up`, wait healthy
#   bash .ci/compose.sh up fleet  # the same with RaftNode01 and RaftNode02 (or COMPOSE_PROFILES=fleet)
#   bash .ci/compose.sh status    # containers and roles (mqadmin clusterList)
#   bash .ci/compose.sh down      # `compose down -v` (containers, network and volumes)
#   bash .ci/compose.sh build     # only the image (prints how long the docker build took)
#   bash .ci/compose.sh secrets   # only docker/run/: a private CA + certificate, the ACL, the configs
#   bash .ci/compose.sh engine    # only make sure a Docker engine answers
#
# No image can be pulled and containers cannot reach PyPI on the development machines, so:
# - a Docker engine is started when none answers (docker.io and docker-compose from Debian);
# - when the default base image (python:3.11-slim) is absent and cannot be pulled, a local base is
#   built from Debian packages with debootstrap and `docker import` (dledger-mq-base:bookworm);
# - the project and its dependencies are built into wheels on the host (docker/wheels/) and the
#   image installs them with --no-index. The Dockerfile is the same online and offline.
# TLS and ACL are on (docs/SECURITY.md): docker/run/ (never committed, removed by `down`) holds the
# certificates, plain_acl.yml, the rendered configs (a fresh peer password) and the admin credentials
# host tools use: DLEDGER_TLS_CA_FILE=docker/run/tls/ca.pem DLEDGER_CREDENTIALS_FILE=docker/run/admin-credentials.yml
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
IMAGE="dledger-mq:local"
DEFAULT_BASE="python:3.11-slim"
LOCAL_BASE="dledger-mq-base:bookworm"
WHEELS="$REPO/docker/wheels"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PROJECT="${COMPOSE_PROJECT_NAME:-dledgermq}"
RUN_DIR="$REPO/docker/run"
# The services, and each group's client ports on the host (wait_healthy: a writable leader per group).
BASE_SERVICES=(namesrv1 namesrv2 n0 n1 n2)
FLEET_SERVICES=(g1n0 g1n1 g1n2 g2n0 g2n1 g2n2)
GROUP_PORTS=("10911 10921 10931")
FLEET_GROUP_PORTS=("11011 11021 11031" "11111 11121 11131")
IMAGE_UID=10001  # the image's dledger user (Dockerfile)
export DLEDGER_TLS_CA_FILE="$RUN_DIR/tls/ca.pem" DLEDGER_CREDENTIALS_FILE="$RUN_DIR/admin-credentials.yml"

log() { printf 'compose: %s\n' "$*" >&2; }
die() { printf 'compose: ERROR: %s\n' "$*" >&2; exit 1; }

apt_install() {
    local missing=() pkg
    for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
    [ "${#missing[@]}" -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] || die "need packages ${missing[*]}: run as root or install them"
    log "apt-get install ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# A Docker engine that answers, or exit 3 with the reason (CI turns that into COMPOSE DRILL NOT RUN).
ensure_engine() {
    if docker info >/dev/null 2>&1; then return 0; fi
    command -v dockerd >/dev/null || apt_install docker.io
    command -v docker >/dev/null || apt_install docker.io
    if ! docker info >/dev/null 2>&1; then
        log "starting dockerd (log: /tmp/dledger-dockerd.log)"
        (nohup dockerd >/tmp/dledger-dockerd.log 2>&1 &)
        local i
        for i in $(seq 1 60); do
            docker info >/dev/null 2>&1 && break
            sleep 1
        done
    fi
    if ! docker info >/dev/null 2>&1; then
        printf 'compose: no Docker engine: %s\n' "$(tail -n 3 /tmp/dledger-dockerd.log 2>/dev/null | tr '\n' ' ')" >&2
        exit 3
    fi
}

COMPOSE=()
find_compose() {
    if docker compose version >/dev/null 2>&1; then
        COMPOSE=(docker compose -p "$PROJECT" -f "$REPO/docker-compose.yml")
    else
        command -v docker-compose >/dev/null || apt_install docker-compose
        COMPOSE=(docker-compose -p "$PROJECT" -f "$REPO/docker-compose.yml")
    fi
}

# The profile "fleet" (three groups): `up fleet`, or COMPOSE_PROFILES naming it (compose reads it too).
FLEET=0
use_fleet() {
    FLEET=1
    export COMPOSE_PROFILES="${COMPOSE_PROFILES:+$COMPOSE_PROFILES,}fleet"
}
case ",${COMPOSE_PROFILES:-}," in *,fleet,*) FLEET=1 ;; esac

# Prints the base image to build FROM, building the local one when the default is unavailable.
ensure_base() {
    if docker image inspect "$DEFAULT_BASE" >/dev/null 2>&1; then echo "$DEFAULT_BASE"; return 0; fi
    if [ -z "${DLEDGER_OFFLINE:-}" ] && timeout 60 docker pull -q "$DEFAULT_BASE" >/dev/null 2>&1; then
        echo "$DEFAULT_BASE"; return 0
    fi
    if docker image inspect "$LOCAL_BASE" >/dev/null 2>&1; then echo "$LOCAL_BASE"; return 0; fi
    command -v debootstrap >/dev/null || apt_install debootstrap
    local root
    root="$(mktemp -d /tmp/dledger-base.XXXXXX)"
    log "building $LOCAL_BASE with debootstrap (bookworm, python3 + venv) from $DEBIAN_MIRROR"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        bookworm "$root/rootfs" "$DEBIAN_MIRROR" >"$root/debootstrap.log" 2>&1 \
        || { tail -n 20 "$root/debootstrap.log" >&2; die "debootstrap failed"; }
    rm -rf "$root/rootfs/var/cache/apt/archives/"*.deb "$root/rootfs/var/lib/apt/lists/"*
    tar -C "$root/rootfs" -c . | docker import \
        -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        -c 'CMD ["/bin/bash"]' - "$LOCAL_BASE" >/dev/null
    rm -rf "$root"
    echo "$LOCAL_BASE"
}

# Wheels of the project and every dependency, built with the host's Python (cp311, like the image).
ensure_wheels() {
    local stamp="$WHEELS/.pyproject.sha256" want
    want="$(sha256sum "$REPO/pyproject.toml" | cut -d' ' -f1)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return 0; fi
    [ -x "$REPO/.venv/bin/pip" ] || bash "$REPO/.ci/setup.sh" >&2
    log "building wheels into docker/wheels"
    find "$WHEELS" -name '*.whl' -delete
    "$REPO/.venv/bin/pip" wheel -q -w "$WHEELS" "$REPO" setuptools wheel >&2
    rm -f "$WHEELS"/dledger_mq-*.whl  # the image builds the project from its sources
    echo "$want" >"$stamp"
}

build() {
    ensure_engine
    local base opts="" started
    base="$(ensure_base)"
    if [ "$base" = "$LOCAL_BASE" ] || [ -n "${DLEDGER_OFFLINE:-}" ]; then
        ensure_wheels
        opts="--no-index"
    fi
    log "docker build -t $IMAGE (base $base${opts:+, $opts})"
    started=$(date +%s)
    DOCKER_BUILDKIT=0 docker build -q -t "$IMAGE" --build-arg "BASE_IMAGE=$base" \
        --build-arg "PIP_INSTALL_OPTS=$opts" "$REPO" >/dev/null
    log "image $IMAGE built in $(( $(date +%s) - started )) s"
}

# docker/run/: certificates, ACL, configs (handed to the containers' user, so it needs root).
secrets() {
    [ -x "$REPO/.venv/bin/python" ] || bash "$REPO/.ci/setup.sh" >&2
    [ "$(id -u)" -eq 0 ] || die "making docker/run needs root (its files go to the containers' uid $IMAGE_UID)"
    "$REPO/.venv/bin/python" "$REPO/docker/make_secrets.py" "$RUN_DIR" --owner "$IMAGE_UID" >&2
}

wait_healthy() {
    local deadline=$(( $(date +%s) + ${1:-120} )) svc state all services=("${BASE_SERVICES[@]}")
    local groups=("${GROUP_PORTS[@]}")
    if [ "$FLEET" -eq 1 ]; then services+=("${FLEET_SERVICES[@]}"); groups+=("${FLEET_GROUP_PORTS[@]}"); fi
    while :; do
        all=1
        for svc in "${services[@]}"; do
            state="$(docker inspect -f '{{.State.Health.Status}}' "$("${COMPOSE[@]}" ps -q "$svc")" 2>/dev/null || echo missing)"
            [ "$state" = "healthy" ] || all=0
        done
        [ "$all" -eq 1 ] && break
        [ "$(date +%s)" -lt "$deadline" ] || { "${COMPOSE[@]}" ps >&2; die "containers not healthy in time"; }
        sleep 1
    done
    # and a writable leader in every group
    DLEDGER_GROUP_PORTS="$(IFS=,; echo "${groups[*]}")" "$REPO/.venv/bin/python" - <<'EOF' || die "no writable leader in time"
import json, os, ssl, time, urllib.request
ctx = ssl.create_default_context(cafile=os.environ["DLEDGER_TLS_CA_FILE"])
deadline = time.time() + 60
waiting = [[int(p) for p in g.split()] for g in os.environ["DLEDGER_GROUP_PORTS"].split(",")]
while waiting and time.time() < deadline:
    for ports in list(waiting):
        for port in ports:
            try:
                with urllib.request.urlopen(f"https://127.0.0.1:{port}/v1/status", timeout=1, context=ctx) as r:
                    if json.load(r).get("writable"):
                        waiting.remove(ports)
                        break
            except OSError:
                pass
    time.sleep(0.5)
raise SystemExit(1 if waiting else 0)
EOF
}

main() {
    local cmd="${1:-up}"
    if [ "${2:-}" = "fleet" ]; then use_fleet; fi
    case "$cmd" in
        engine) ensure_engine ;;
        build) build ;;
        secrets) secrets ;;
        up)
            secrets
            build
            find_compose
            log "${COMPOSE[*]} up -d"
            "${COMPOSE[@]}" up -d --no-build >&2
            wait_healthy 180
            NAMESRV_ADDR=127.0.0.1:9876 "$REPO/.venv/bin/mqadmin" clusterList
            log "host tools: export NAMESRV_ADDR=127.0.0.1:9876 DLEDGER_TLS_CA_FILE=$DLEDGER_TLS_CA_FILE DLEDGER_CREDENTIALS_FILE=$DLEDGER_CREDENTIALS_FILE"
            ;;
        status)
            ensure_engine; find_compose
            "${COMPOSE[@]}" ps
            NAMESRV_ADDR=127.0.0.1:9876 "$REPO/.venv/bin/mqadmin" clusterList || true
            ;;
        down)
            ensure_engine; find_compose
            COMPOSE_PROFILES=fleet "${COMPOSE[@]}" down -v --remove-orphans >&2  # every profile's containers
            rm -rf "$RUN_DIR"  # the secrets go with the cluster
            ;;
        *) die "usage: compose.sh up [fleet]|status|down|build|secrets|engine" ;;
    esac
}

main "$@"

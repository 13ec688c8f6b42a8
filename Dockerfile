# One image for the NameServer and the broker (the command picks the role).
#
# Online (default):    docker build -t dledger-mq .
# Offline (no pulls, no PyPI): bash .ci/compose.sh build — it builds a local base image from Debian
# packages (debootstrap + docker import) when the default base is absent, fills docker/wheels/ with
# wheels built on the host, and passes BASE_IMAGE and PIP_INSTALL_OPTS=--no-index. This file is
# the same in both cases.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG PIP_INSTALL_OPTS=""
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH

RUN python3 -m venv /opt/venv \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/dledger --shell /usr/sbin/nologin dledger \
    && mkdir -p /var/lib/dledger \
    && chown dledger:dledger /var/lib/dledger

WORKDIR /opt/dledger-mq
# Empty (just .gitkeep) for online builds; wheels built on the host for offline ones.
COPY docker/wheels/ /tmp/wheels/
COPY pyproject.toml README.md ./
COPY dledger/ dledger/
COPY namesrv/ namesrv/
COPY broker/ broker/
COPY conf/ conf/
RUN pip install --no-cache-dir --find-links /tmp/wheels ${PIP_INSTALL_OPTS} . \
    && rm -rf /tmp/wheels build *.egg-info

USER dledger
VOLUME ["/var/lib/dledger"]
EXPOSE 9876 10911 40911
# HEALTH_URL: the process's own /v1/status (compose sets it per service).
ENV HEALTH_URL=http://127.0.0.1:9876/v1/status
HEALTHCHECK --interval=5s --timeout=3s --start-period=20s --retries=3 CMD ["python3", "-m", "dledger.apps.healthcheck"]
CMD ["dledger-namesrv", "-c", "conf/compose/namesrv.conf"]

# syntax=docker/dockerfile:1
# One image for every process of proxy-operator: the watcher
# (`proxy-operator watch`), Celery workers and beat (`celery -A workers ...`), the API
# (`proxy-operator api`, served by granian) and Flower. Build with the commit stamped in:
#   docker build --build-arg GIT_COMMIT=$(git rev-parse HEAD) -t proxy-operator .
# The base image is pinned by the digest of python:3.11-slim's manifest list, the Python
# dependencies by requirements.lock (every version and its sha256): how to bump either is in
# deploy/README.md, "The image".
ARG PYTHON_IMAGE=python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7

# --- build: compile libvirt-python and install the project into a virtualenv -----------
FROM ${PYTHON_IMAGE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev pkg-config libvirt-dev \
 && rm -rf /var/lib/apt/lists/*
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
WORKDIR /src
# Exactly the locked versions, each checked against its hashes; nothing resolved at build time.
# Build backends are locked too (requirements-build.lock) and used without build isolation,
# which would fetch them unchecked.
COPY requirements-build.lock requirements.lock ./
RUN /opt/venv/bin/pip install --require-hashes --no-deps -r requirements-build.lock \
 && /opt/venv/bin/pip install --require-hashes --no-deps --no-build-isolation -r requirements.lock
COPY pyproject.toml README.md ./
COPY app/ app/
COPY api/ api/
COPY watchers/ watchers/
COPY workers/ workers/
COPY cli/ cli/
RUN /opt/venv/bin/pip install --no-deps --no-build-isolation . \
 && /opt/venv/bin/pip check

# --- runtime ------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}
ARG GIT_COMMIT=unknown
LABEL org.opencontainers.image.title="proxy-operator" \
      org.opencontainers.image.description="Keeps a fleet of Squid forward proxies alive on Kubernetes, GCP and KVM, and leases them to crawlers." \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.revision="${GIT_COMMIT}"
# libvirt0: the shared library libvirt-python links against (the daemon runs on the hosts).
RUN apt-get update \
 && apt-get install -y --no-install-recommends libvirt0 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 proxyop \
 && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home \
            --shell /usr/sbin/nologin proxyop
COPY --from=build /opt/venv /opt/venv
# The CRDs travel with the image (e.g. for a job that applies them).
COPY deploy/crd/ /opt/proxy-operator/crd/
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    GIT_COMMIT=${GIT_COMMIT} \
    PROXY_OPERATOR_CRD_DIR=/opt/proxy-operator/crd
# Runs with a read-only root filesystem: only /tmp (an emptyDir / tmpfs) is written.
WORKDIR /tmp
USER 10001:10001
EXPOSE 8080 8081 5555
CMD ["proxy-operator", "version"]

# The one image of O41 Artifacts: it runs the operator (`python -m o41.operator`) and the
# placement service (`python -m o41.webhook`); the Helm chart picks which by its args. It
# also carries the `o41` CLI, so a Job can use the same image.
#
#   docker build -t ghcr.io/o41/o41-artifacts:0.1.0 .
#
# Two stages: the builder makes wheels (and may need a compiler for a dependency without a
# wheel for this platform); the runtime stage installs only those wheels, with the exact
# versions of requirements/lock.txt as constraints, so no build tool and no pip cache is
# left in the image.

ARG PYTHON=3.11-slim-bookworm
# etcdutl of the chart's etcd release (etcd.image), for the etcd members' restore step
# (docs/operations.md, "Backups and restore"): the official etcd image carries it.
ARG ETCD_IMAGE=quay.io/coreos/etcd:v3.6.16

FROM ${ETCD_IMAGE} AS etcd

FROM python:${PYTHON} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY requirements/lock.txt requirements/lock.txt
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip wheel --wheel-dir /wheels --constraint requirements/lock.txt ".[server]"

FROM python:${PYTHON}
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    MALLOC_ARENA_MAX=2
COPY --from=build /wheels /wheels
COPY --from=etcd /usr/local/bin/etcdutl /usr/local/bin/etcdutl
COPY requirements/lock.txt /tmp/lock.txt
RUN pip install --no-index --find-links /wheels --constraint /tmp/lock.txt "o41-artifacts[server]" \
    && rm -rf /wheels /tmp/lock.txt \
    && groupadd --gid 10001 o41 \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin o41
# numeric, so Kubernetes can check runAsNonRoot; the chart sets the same ids
USER 10001:10001
WORKDIR /tmp
# The chart always passes the command; this default serves the placement service.
CMD ["python", "-m", "o41.webhook", "--host", "0.0.0.0", "--port", "8080"]

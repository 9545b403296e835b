# syntax=docker/dockerfile:1
# gpu-admission: the webhook server, the certs tool (the chart's hook Job) and the selftest (helm test), one image.
#
#   docker build -t gpu-admission:0.1.0 .
#
# The base is pinned to an exact patch release. For reproducible builds also pin its digest, e.g.
#   docker buildx imagetools inspect python:3.11.13-slim-bookworm --format '{{json .Manifest.Digest}}'
#   docker build --build-arg PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:<digest> .
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/venv
COPY pyproject.toml README.md ./
COPY webhook ./webhook
COPY certs ./certs
# Bytecode is compiled here, at build time: the running container cannot write it (read-only root filesystem).
RUN /opt/venv/bin/pip install '.[aws]' \
 && /opt/venv/bin/python -m compileall -q /opt/venv/lib

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="gpu-admission" \
      org.opencontainers.image.description="Admission webhook for rented-GPU clusters: CUDA/driver checks, fractional GPUs as MIG, spot tolerations" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/venv /opt/venv
# Read-only root filesystem: no bytecode writes, unbuffered logs (the decision log is one JSON line per request),
# everything writable lives under /tmp, an emptyDir in the chart.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    MALLOC_ARENA_MAX=2 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    PROMETHEUS_MULTIPROC_DIR=/tmp/metrics
# Non-root, numeric (so Kubernetes' runAsNonRoot can verify it without /etc/passwd).
USER 65532:65532
WORKDIR /tmp
EXPOSE 8443 9090
# Kubernetes uses the chart's probes; this is for plain docker runs. Self-signed certificates: no verification.
HEALTHCHECK --interval=30s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import ssl, urllib.request; urllib.request.urlopen('https://127.0.0.1:8443/healthz', context=ssl._create_unverified_context(), timeout=2)"]
ENTRYPOINT ["gpu-admission"]
CMD ["serve", "--config", "/etc/gpu-admission/config.yaml", "--cert", "/tls/tls.crt", "--key", "/tls/tls.key", "--port", "8443", "--metrics-port", "9090"]

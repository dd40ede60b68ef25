# The eyrie operator: `eyrie operator` (kopf), run by the Helm chart's Deployment.
# Build from the repository root:  docker build -f images/operator.Dockerfile -t ghcr.io/eyrie-dev/eyrie-operator:0.1.0 .
# EYRIE_VERSION must equal `version` in pyproject.toml and the chart's appVersion (tests/test_images.py).

ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

# --- the repository's wheel (the COPY below fails if its version is not EYRIE_VERSION)
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY jobs ./jobs
COPY operator ./operator
# -P: the working directory is not put on sys.path, or /src/operator would shadow the standard library's operator
RUN python -P -m pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

# --- runtime
FROM ${PYTHON_IMAGE}
ARG EYRIE_VERSION=0.1.0
LABEL org.opencontainers.image.title="eyrie-operator" \
      org.opencontainers.image.version="${EYRIE_VERSION}" \
      org.opencontainers.image.description="eyrie Kubernetes operator (kopf)"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp
COPY --from=wheel /dist/eyrie-${EYRIE_VERSION}-py3-none-any.whl /tmp/wheels/
# the operator extra: kopf and kubernetes_asyncio, no torch or transformers
RUN python -m pip install --no-cache-dir "/tmp/wheels/eyrie-${EYRIE_VERSION}-py3-none-any.whl[operator]" \
    && rm -rf /tmp/wheels \
    && python -c "import importlib.metadata as m; v = m.version('eyrie'); assert v == '${EYRIE_VERSION}', v" \
    && groupadd --gid 10001 eyrie \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin eyrie
USER 10001:10001
ENTRYPOINT ["eyrie"]
CMD ["operator", "--standalone"]

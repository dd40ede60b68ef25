# The eyrie operator: `eyrie operator` (kopf), run by the Helm chart's Deployment.
# Build from the repository root:  docker build -f images/operator.Dockerfile -t ghcr.io/eyrie-dev/eyrie-operator:0.1.0 .
# EYRIE_VERSION must equal `version` in pyproject.toml and the chart's appVersion (tests/house/test_images.py).

ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

# --- the dependencies' list, from pyproject.toml alone (images/requirements.py): the same text while the declared
#     dependencies stay the same, so the runtime stage's install layer is reused across source edits (docker build
#     and buildah --layers key a COPY --from on the content it brings)
FROM ${PYTHON_IMAGE} AS requirements
WORKDIR /src
COPY pyproject.toml images/requirements.py ./
RUN python requirements.py operator > /requirements.txt

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
# the dependencies of the operator extra (kopf, kubernetes_asyncio; no torch or transformers) in a layer of their own
COPY --from=requirements /requirements.txt /tmp/requirements.txt
RUN python -m pip install --no-cache-dir --requirement /tmp/requirements.txt \
    && rm /tmp/requirements.txt \
    && groupadd --gid 10001 eyrie \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin eyrie
# then the wheel: --no-index, so the build fails if the layer below lacks any of its requirements
COPY --from=wheel /dist/eyrie-${EYRIE_VERSION}-py3-none-any.whl /tmp/wheels/
RUN python -m pip install --no-cache-dir --no-index "/tmp/wheels/eyrie-${EYRIE_VERSION}-py3-none-any.whl[operator]" \
    && rm -rf /tmp/wheels \
    && python -c "import importlib.metadata as m; v = m.version('eyrie'); assert v == '${EYRIE_VERSION}', v"
USER 10001:10001
ENTRYPOINT ["eyrie"]
CMD ["operator", "--standalone"]

# The Ray image of a generation RayJob (spec.generation.ray.image): head and workers run eyrie's
# generation job. Base: the official Ray image for the Ray version eyrie is tested with, Python 3.11.
# Build from the repository root:  docker build -f images/ray-worker.Dockerfile -t ghcr.io/eyrie-dev/eyrie-ray-worker:0.1.0 .
# RAY_IMAGE may instead be a plain Python 3.11 image (hack/images.sh passes a Debian one): the user ray is then
# created here and Ray itself comes with the generate extra's dependencies, pinned to RAY_VERSION.

ARG RAY_IMAGE=rayproject/ray:2.60.0-py311

# --- the dependencies' list, from pyproject.toml alone (images/requirements.py): the same text while the declared
#     dependencies stay the same, so the runtime stage's install layer is reused across source edits (docker build
#     and buildah --layers key a COPY --from on the content it brings)
FROM ${RAY_IMAGE} AS requirements
USER root
WORKDIR /src
COPY pyproject.toml images/requirements.py ./
RUN python requirements.py generate > /requirements.txt

# build stage only (discarded): root, so the in-tree build may write next to the sources
FROM ${RAY_IMAGE} AS wheel
USER root
WORKDIR /src
COPY pyproject.toml README.md ./
COPY jobs ./jobs
COPY operator ./operator
# -P: the working directory is not put on sys.path, or /src/operator would shadow the standard library's operator
RUN python -P -m pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

FROM ${RAY_IMAGE}
ARG EYRIE_VERSION=0.1.0
ARG RAY_VERSION=2.60.0
LABEL org.opencontainers.image.title="eyrie-ray-worker" \
      org.opencontainers.image.version="${EYRIE_VERSION}" \
      org.opencontainers.image.description="Ray ${RAY_VERSION} with eyrie: the generation job's head and workers"
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/home/ray
# installed as root: the official image's Python belongs to ray, a plain base's to root
USER root
# the official image's user (uid 1000, group users); a plain Python base gets the same one
RUN id -u ray >/dev/null 2>&1 || useradd --uid 1000 --gid 100 --create-home --home-dir /home/ray --shell /bin/bash ray
# the generate extra's dependencies (what `eyrie run --until samples` imports, no torch: extraction runs in its own
# image) in a layer of their own. The constraint keeps the image's Ray (or installs exactly it): driver and workers
# must run the same Ray version
COPY --from=requirements /requirements.txt /tmp/requirements.txt
RUN echo "ray==${RAY_VERSION}" > /tmp/ray-constraint.txt \
    && python -m pip install --no-cache-dir --constraint /tmp/ray-constraint.txt --requirement /tmp/requirements.txt \
    && rm /tmp/requirements.txt /tmp/ray-constraint.txt
# then the wheel: --no-index, so the build fails if the layer below lacks any of its requirements
COPY --from=wheel /dist/eyrie-${EYRIE_VERSION}-py3-none-any.whl /tmp/wheels/
RUN python -m pip install --no-cache-dir --no-index "/tmp/wheels/eyrie-${EYRIE_VERSION}-py3-none-any.whl[generate]" \
    && rm -rf /tmp/wheels \
    && python -c "import importlib.metadata as m; v = m.version('eyrie'); assert v == '${EYRIE_VERSION}', v; r = m.version('ray'); assert r == '${RAY_VERSION}', r"
# numeric, so that a pod's runAsNonRoot can check it
USER 1000:100
WORKDIR /home/ray

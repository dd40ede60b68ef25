# The extraction image (spec.extraction.image): `eyrie extract` in the extraction Job's pods.
# Two variants of one eyrie wheel, one entry point:
#   the default target, for GPU pods (SGLang prefill-only): the official SGLang image (CUDA 13, Python 3.12) of the
#   version the `sglang` extra pins (pyproject.toml);
#     docker build -f images/extractor.Dockerfile -t ghcr.io/eyrie-dev/eyrie-extractor:0.1.0 .
#   `--target cpu`, for CPU pods (extraction.engine: transformers): Python 3.11 with torch's CPU build;
#     docker build -f images/extractor.Dockerfile --target cpu -t ghcr.io/eyrie-dev/eyrie-extractor:0.1.0-cpu .
# Build from the repository root.

ARG SGLANG_IMAGE=lmsysorg/sglang:v0.5.23-cu130
# the wheel stage's and the CPU variant's base
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

# --- the dependencies' lists of both variants, from pyproject.toml alone (images/requirements.py): the same text while
#     the declared dependencies stay the same, so each variant's install layer is reused across source edits (docker
#     build and buildah --layers key a COPY --from on the content it brings)
FROM ${PYTHON_IMAGE} AS requirements
WORKDIR /src
COPY pyproject.toml images/requirements.py ./
RUN mkdir /requirements \
    && python requirements.py specforge > /requirements/cpu.txt \
    && python requirements.py specforge sglang > /requirements/gpu.txt

# --- the repository's wheel, for both variants (the COPYs below fail if its version is not EYRIE_VERSION)
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY jobs ./jobs
COPY operator ./operator
# -P: the working directory is not put on sys.path, or /src/operator would shadow the standard library's operator
RUN python -P -m pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

# --- CPU variant (--target cpu): the transformers backend
FROM ${PYTHON_IMAGE} AS cpu
ARG EYRIE_VERSION=0.1.0
ARG TORCH_VERSION=2.13.0
# SpecForge's code trains and measures the pilot's drafters (`eyrie pilot`, `eyrie evaluate`): installed --no-deps (its
# own pins, another torch and SGLang, are never installed), as the `specforge` extra says; jobs/evaluate/plan.py's
# SPECFORGE_VERSION. Its loss module imports triton at the top, which torch's CPU build does not bring: on a CPU the
# drafter runs SpecForge's torch formula of the loss, so triton is only imported, never run
ARG SPECFORGE_VERSION=0.2.0
ARG TRITON_VERSION=3.7.1
# torch's CPU build; empty: pip's default index, whose Linux torch is the CUDA build (several GB more)
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
LABEL org.opencontainers.image.title="eyrie-extractor" \
      org.opencontainers.image.version="${EYRIE_VERSION}" \
      org.opencontainers.image.description="eyrie[specforge] with torch ${TORCH_VERSION}: hidden-state extraction on CPU (transformers backend), the pilot's drafters"
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/home/eyrie \
    HF_HOME=/home/eyrie/.cache/huggingface
# torch first, in a layer of its own: the biggest, rebuilt only when TORCH_VERSION or TORCH_INDEX_URL changes
RUN python -m pip install --no-cache-dir ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==${TORCH_VERSION}"
# the specforge extra's other dependencies (the jobs extra's and SpecForge's data code's), in a layer of their own (the
# constraint keeps that torch), then SpecForge itself and triton, without their dependencies
COPY --from=requirements /requirements/cpu.txt /tmp/requirements.txt
RUN echo "torch==${TORCH_VERSION}" > /tmp/torch-constraint.txt \
    && python -m pip install --no-cache-dir --constraint /tmp/torch-constraint.txt --requirement /tmp/requirements.txt \
    && python -m pip install --no-cache-dir --no-deps "specforge==${SPECFORGE_VERSION}" "triton==${TRITON_VERSION}" \
    && rm /tmp/requirements.txt /tmp/torch-constraint.txt \
    && groupadd --gid 10001 eyrie \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/eyrie --shell /usr/sbin/nologin eyrie
# then the wheel: --no-index, so the build fails if the layers below lack any of its requirements
COPY --from=wheel /dist/eyrie-${EYRIE_VERSION}-py3-none-any.whl /tmp/wheels/
RUN python -m pip install --no-cache-dir --no-index "/tmp/wheels/eyrie-${EYRIE_VERSION}-py3-none-any.whl[specforge]" \
    && rm -rf /tmp/wheels \
    && python -c "import importlib.metadata as m; v = m.version('eyrie'); assert v == '${EYRIE_VERSION}', v"
USER 10001:10001
WORKDIR /home/eyrie
ENTRYPOINT []
CMD ["eyrie", "extract", "--help"]

# --- GPU variant (the default target): SGLang's image
FROM ${SGLANG_IMAGE}
ARG EYRIE_VERSION=0.1.0
ARG SGLANG_VERSION=0.5.23
ARG SPECFORGE_VERSION=0.2.0
LABEL org.opencontainers.image.title="eyrie-extractor" \
      org.opencontainers.image.version="${EYRIE_VERSION}" \
      org.opencontainers.image.description="SGLang ${SGLANG_VERSION} with eyrie[sglang]: hidden-state extraction"
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/home/eyrie \
    HF_HOME=/home/eyrie/.cache/huggingface
# Freeze the image's CUDA stack: installing eyrie[jobs,sglang] must not replace torch or SGLang. If the
# extra's SGLang pin and the image disagree, pip fails here instead of building a mixed image. The dependencies first,
# in a layer of their own
COPY --from=requirements /requirements/gpu.txt /tmp/requirements.txt
RUN python3 -c "import sys; assert sys.version_info >= (3, 11), 'eyrie needs Python >= 3.11; pick an SGLang image that has it'" \
    && python3 -c "import importlib.metadata as m, sys; v = m.version('sglang'); sys.exit(None if v == '${SGLANG_VERSION}' else f'the base image has SGLang {v}; eyrie[sglang] pins ${SGLANG_VERSION}')" \
    && python3 -c "import importlib.metadata as m; print('\n'.join(f'{p}=={m.version(p)}' for p in ('torch', 'sglang')))" > /tmp/image-constraints.txt \
    && python3 -m pip install --no-cache-dir --constraint /tmp/image-constraints.txt --requirement /tmp/requirements.txt \
    && python3 -m pip install --no-cache-dir --no-deps "specforge==${SPECFORGE_VERSION}" \
    && rm /tmp/requirements.txt /tmp/image-constraints.txt \
    && groupadd --gid 10001 eyrie \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/eyrie --shell /usr/sbin/nologin eyrie
# then the wheel: --no-index, so the build fails if the layer below lacks any of its requirements
COPY --from=wheel /dist/eyrie-${EYRIE_VERSION}-py3-none-any.whl /tmp/wheels/
RUN python3 -m pip install --no-cache-dir --no-index "/tmp/wheels/eyrie-${EYRIE_VERSION}-py3-none-any.whl[specforge,sglang]" \
    && rm -rf /tmp/wheels \
    && python3 -c "import importlib.metadata as m; v = m.version('eyrie'); assert v == '${EYRIE_VERSION}', v"
USER 10001:10001
WORKDIR /home/eyrie
ENTRYPOINT []
CMD ["eyrie", "extract", "--help"]

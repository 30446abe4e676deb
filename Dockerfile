# syntax=docker/dockerfile:1
#
# One image for every Primus-SaFE service; the command picks the service:
#   docker run primus-safe scheduler
#   docker run primus-safe health scheduler
#
# Targets:
#   runtime (default)  the five services, no torch             -> primus-safe
#   agent              + torch (CPU build): the bench agent      -> primus-safe-agent
#                      and training workers on machines without GPUs
#
#   docker build -t primus-safe .
#   docker build --target agent -t primus-safe-agent .
#
# ROCm build of the bench agent (what the Helm chart runs on GPU nodes):
# start from AMD's rocm/pytorch image, whose torch is built for ROCm, and
# install the project WITHOUT the `agent` extra, which pins the PyPI torch
# and would replace the ROCm build with a CPU/CUDA one:
#
#   FROM rocm/pytorch:<rocm>_<ubuntu>_<python>_pytorch_release_<version>
#   COPY pyproject.toml README.m[d] /src/
#   COPY libs /src/libs
#   COPY services /src/services
#   COPY cli /src/cli
#   RUN python3 -m pip install --no-cache-dir /src && rm -rf /src
#   ENTRYPOINT ["primus-safe"]
#   CMD ["bench-agent"]
#
# Pick the rocm/pytorch tag whose torch matches the `agent` extra in
# pyproject.toml, and check the result with
#   docker run --rm --device=/dev/kfd --device=/dev/dri IMAGE health ...
# The agent runs as root there: in Kubernetes it is privileged to reach every
# GPU of its node (see deploy/helm/primus-safe/values.yaml, benchAgent).

ARG PYTHON_VERSION=3.11

# ---------------------------------------------------------------- build ---
FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Metadata first, so that a code change does not re-resolve dependencies.
# (README.m[d]: the readme is optional for the build; a glob that matches
# nothing is allowed as long as pyproject.toml is copied.)
COPY pyproject.toml README.m[d] ./
COPY libs ./libs
COPY services ./services
COPY cli ./cli
RUN pip install . \
 && primus-safe --help >/dev/null

# ---------------------------------------------------------- agent-build ---
FROM build AS agent-build
# torch from the CPU wheel index: the PyPI wheel drags in the CUDA runtime
# (gigabytes) that a machine without GPUs never uses. Override for CUDA:
#   --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN TORCH_SPEC=$(python -c "import tomllib; d = tomllib.load(open('pyproject.toml', 'rb')); print(next(r for r in d['project']['optional-dependencies']['agent'] if r.startswith('torch')))") \
 && pip install --index-url "$TORCH_INDEX_URL" "$TORCH_SPEC" \
 && pip install ".[agent]" \
 && python -c "import torch; print('torch', torch.__version__)"

# ---------------------------------------------------------- runtime-base ---
FROM python:${PYTHON_VERSION}-slim-bookworm AS runtime-base
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PRIMUS_STATE_DIR=/var/lib/primus-safe
# A fixed, unprivileged user (the Helm chart runs as 10001 too). The state
# directory exists in the image so that a named volume mounted there is
# created owned by this user.
RUN groupadd --system --gid 10001 primus \
 && useradd --system --uid 10001 --gid primus --home-dir /var/lib/primus-safe \
        --no-create-home --shell /usr/sbin/nologin primus \
 && install -d -o primus -g primus -m 0750 /var/lib/primus-safe
WORKDIR /var/lib/primus-safe

# ---------------------------------------------------------------- agent ---
FROM runtime-base AS agent
COPY --from=agent-build /opt/venv /opt/venv
USER 10001:10001
ENTRYPOINT ["primus-safe"]
CMD ["bench-agent"]

# -------------------------------------------------------------- runtime ---
# Last stage: the default target.
FROM runtime-base AS runtime
COPY --from=build /opt/venv /opt/venv
USER 10001:10001
ENTRYPOINT ["primus-safe"]
CMD ["--help"]

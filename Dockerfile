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
#   agent-rocm         + AMD's ROCm torch: the bench agent on    -> primus-safe-agent-rocm
#                      GPU nodes (what the Helm chart runs there)
#
#   docker build -t primus-safe .
#   docker build --target agent -t primus-safe-agent .
#   docker build --target agent-rocm -t primus-safe-agent-rocm \
#       [--build-arg ROCM_PYTORCH_IMAGE=rocm/pytorch:<another exact tag>] .
#
# Every runnable stage starts `primus-safe <service>` (ENTRYPOINT primus-safe,
# the service as the command) as the unprivileged user 10001.
#
# ROCm build of the bench agent (agent-rocm): what changes from `agent`.
#   - The base is AMD's rocm/pytorch (ROCM_PYTORCH_IMAGE), whose torch is
#     built for ROCm (HIP) with the ROCm runtime, RCCL and amd-smi; the agent
#     benchmarks the GPUs with that torch.
#   - The project is installed WITHOUT the `agent` extra: its PyPI torch pin
#     would replace the ROCm build with a CPU/CUDA one. The build fails when
#     the base's torch is not a ROCm build. The default is an exact tag
#     (`latest` moves); pick one whose torch is close to the `agent` extra in
#     pyproject.toml (the ROCm images trail PyPI's torch releases).
#   - It installs into the base image's own Python environment (no venv
#     copy: the ROCm libraries live in that image), so the image is large.
#   - GPU access: the device nodes /dev/kfd and /dev/dri/renderD* belong to
#     the host's `video` and `render` groups. Locally:
#       docker run --rm --device=/dev/kfd --device=/dev/dri \
#         --group-add video --group-add render IMAGE bench-agent --node $(hostname)
#     (the group names resolve inside the image; if the host's ids differ,
#     pass the numbers: --group-add $(getent group render | cut -d: -f3)).
#     In Kubernetes the chart runs the agent privileged, or as root without
#     capabilities when it claims GPUs from the device plugin; it never needs
#     the host's PID namespace (deploy/helm/primus-safe/values.yaml,
#     benchAgent, says why).

# Every base image is an exact version (tests/deploy/test_image_pins.py fails
# on latest, no tag, or a major/minor only such as 3.11): a rebuild gets the
# same bases. Bump them on purpose; append @sha256:<digest> to pin content.
ARG PYTHON_VERSION=3.11.14
# AMD's ROCm build of torch: rocm/pytorch:rocm<ver>_ubuntu<ver>_py<ver>_pytorch_release_<ver>.
ARG ROCM_PYTORCH_IMAGE=rocm/pytorch:rocm7.2.4_ubuntu24.04_py3.12_pytorch_release_2.10.0

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

# ----------------------------------------------------------- agent-rocm ---
FROM ${ROCM_PYTORCH_IMAGE} AS agent-rocm
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PRIMUS_STATE_DIR=/var/lib/primus-safe
COPY pyproject.toml README.m[d] /src/
COPY libs /src/libs
COPY services /src/services
COPY cli /src/cli
# No `agent` extra: the base image's ROCm torch stays (see the notes above).
RUN python3 -c "import torch, sys; sys.exit(0 if torch.version.hip else 'torch in ROCM_PYTORCH_IMAGE is not a ROCm build')" \
 && python3 -m pip install /src \
 && rm -rf /src \
 && primus-safe --help >/dev/null \
 && groupadd --system --gid 10001 primus \
 && useradd --system --uid 10001 --gid primus --home-dir /var/lib/primus-safe \
        --no-create-home --shell /usr/sbin/nologin primus \
 && for group in video render; do \
        if getent group "$group" >/dev/null; then usermod -aG "$group" primus; fi; \
    done \
 && install -d -o primus -g primus -m 0750 /var/lib/primus-safe
WORKDIR /var/lib/primus-safe
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

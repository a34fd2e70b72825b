# AlephLM-0 E1 image: the seed's stack (CPython 3.11.10 [GCC 11.4.0], torch 2.4.1+cu124,
# cuDNN 9.1.0, triton 3.0.0, pip_freeze.txt) with the aleph code baked in.
# Build: ALEPH_REVISION=$(git rev-parse HEAD) docker compose build   (docs/docker.md)
# No `# syntax=` line: the daemon's built-in BuildKit frontend builds this file (RUN
# --mount=type=cache included), so a site without Docker Hub access can still build it.

# Base pinned by digest. The digests come from public build logs, not from a pull made
# here: re-check them (`docker buildx imagetools inspect nvidia/cuda:12.4.1-cudnn-devel-ubuntu22.04`)
# and mirror the image (docs/docker.md), since NVIDIA deletes end-of-life tags.
# devel, not runtime: torch.compile (inductor) and triton compile C launchers and kernels
# at run time and need gcc, libc headers and the CUDA headers; the runtime flavour has none.
# Its cuDNN is 9.1.0.70, as the seed; torch still loads its own pip-installed CUDA 12.4.99 set.
ARG BASE_IMAGE=nvidia/cuda:12.4.1-cudnn-devel-ubuntu22.04@sha256:622e78a1d02c0f90ed900e3985d6c975d8e2dc9ee5e61643aed587dcf9129f42

FROM ${BASE_IMAGE} AS base
# The capture date (2026-08-07T00:00:00Z): timestamps in layers and .pyc files (py_compile
# writes checked-hash .pyc files when it is set, PEP 552), CPython's build date (GCC's
# __DATE__/__TIME__ honour it), useradd's /etc/shadow date, and the Ubuntu archive snapshot
# that fixes every apt package version. For layer timestamps pass it to BuildKit too
# (docs/docker.md, "Reproducible builds": --build-arg SOURCE_DATE_EPOCH, rewrite-timestamp).
ARG SOURCE_DATE_EPOCH=1786060800
ARG APT_SNAPSHOT=20260807T000000Z
ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 TZ=UTC SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The archive and security pockets move daily; the snapshot does not. NVIDIA's CUDA apt
# source is not snapshotted, so it is removed: nothing may upgrade the base's CUDA packages.
RUN set -eux; \
    rm -f /etc/apt/sources.list.d/cuda*.list /etc/apt/sources.list.d/nvidia*.list; \
    sed -i -E "s#https?://(archive|security)\.ubuntu\.com/ubuntu/?#https://snapshot.ubuntu.com/ubuntu/${APT_SNAPSHOT}/#" /etc/apt/sources.list; \
    grep -q "snapshot.ubuntu.com/ubuntu/${APT_SNAPSHOT}" /etc/apt/sources.list; \
    if grep -Eq '^deb .*(archive|security)\.ubuntu\.com' /etc/apt/sources.list; then exit 1; fi; \
    echo 'Acquire::Check-Valid-Until "false";' > /etc/apt/apt.conf.d/10snapshot

FROM base AS python-build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG PYTHON_VERSION=3.11.10
# As pinned by the official python images; checked before anything from the tarball runs.
ARG PYTHON_SHA256=07a4356e912900e61a15cb0949a06c4a05012e213ecd6b4e84d0f67aabbee372
# hadolint ignore=DL3008 # versions are fixed by the dated apt snapshot of the base stage
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential ca-certificates curl \
       libbz2-dev libffi-dev libgdbm-dev liblzma-dev libncursesw5-dev libreadline-dev \
       libsqlite3-dev libssl-dev uuid-dev xz-utils zlib1g-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /usr/src/python
RUN set -eux; \
    curl -fsSLo python.tar.xz "https://www.python.org/ftp/python/${PYTHON_VERSION}/Python-${PYTHON_VERSION}.tar.xz"; \
    echo "${PYTHON_SHA256}  python.tar.xz" | sha256sum -c -; \
    tar -xJf python.tar.xz --strip-components=1; \
    rm python.tar.xz; \
    ./configure --prefix=/opt/python --enable-optimizations --with-lto --with-ensurepip=install; \
    make -j"$(nproc)"; \
    make install; \
    find /opt/python/lib/python3.11 -depth -type d \( -name test -o -name tests -o -name idle_test \) -exec rm -rf {} +; \
    /opt/python/bin/python3.11 -c 'import platform, sys; v, c = platform.python_version(), platform.python_compiler(); print(sys.version); sys.exit(0 if (v, c) == ("3.11.10", "GCC 11.4.0") else f"built {v} [{c}], the seed has 3.11.10 [GCC 11.4.0]")'

FROM base AS image
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Fixed uid so files on the work volume keep one owner across rebuilds and hosts.
ARG ALEPH_UID=1000
# gcc/g++ and libc headers: triton and inductor compile at run time. tini: PID 1 that
# forwards SIGTERM (docker compose stop) to the trainer. The rest: the CPython build's libs.
# hadolint ignore=DL3008 # versions are fixed by the dated apt snapshot of the base stage
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates g++ gcc libbz2-1.0 libc6-dev \
       libffi8 libgdbm6 liblzma5 libncursesw6 libreadline8 libsqlite3-0 libssl3 libuuid1 \
       procps tini zlib1g \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt/* /var/log/dpkg.log \
       /var/log/alternatives.log /var/cache/ldconfig/aux-cache \
    && groupadd --gid "${ALEPH_UID}" aleph \
    && useradd --uid "${ALEPH_UID}" --gid aleph --create-home --shell /bin/bash aleph \
    && mkdir -p /workspace \
    && chown aleph:aleph /workspace
COPY --from=python-build /opt/python /opt/python
ENV PATH=/opt/python/bin:${PATH} \
    PYTHONPATH=/opt/aleph \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    ALEPH_IN_IMAGE=1 \
    ALEPH_WORK=/workspace \
    HF_HOME=/workspace/cache/huggingface \
    TRITON_CACHE_DIR=/workspace/cache/triton \
    TORCHINDUCTOR_CACHE_DIR=/workspace/cache/inductor
WORKDIR /opt/aleph

# Dependency layer first, so a code edit does not reinstall 4 GB of wheels.
# The check fails the build by name if a cu124 hash is ever missing (a pin changed and
# `lockfiles/relock.py --fill-cu124` was not rerun); pip --require-hashes then re-checks
# the bytes of every wheel.
# image-cu124.txt names the PyTorch cu124 index itself (its --index-url line, from the one
# constant in relock.py), so only torch/torchvision/torchaudio come from there; everything
# else, the nvidia wheels included, comes from the default index (pytorch/pytorch#193491).
COPY lockfiles/ lockfiles/
RUN PYTHONDONTWRITEBYTECODE=1 python3 lockfiles/relock.py --check-complete lockfiles/image-cu124.txt
# PYTHONHASHSEED=0: set order in marshalled .pyc constants does not follow the build's seed.
RUN --mount=type=cache,target=/root/.cache/pip \
    PYTHONHASHSEED=0 python3 -m pip install --require-hashes --no-deps --only-binary :all: \
       -r lockfiles/image.txt \
    && PYTHONHASHSEED=0 python3 -m pip install --require-hashes --no-deps --only-binary :all: \
       -r lockfiles/image-cu124.txt \
    && python3 -m pip check

# The code, baked in: runs from PYTHONPATH, so it adds no distribution to the freeze.
COPY pip_freeze.txt pyproject.toml ./
COPY aleph/ aleph/
COPY tests/ tests/
COPY docker/ docker/
# The benchmarks and bench/gpu_check.py (the check a person with a GPU runs once).
COPY bench/ bench/
ARG ALEPH_REVISION
LABEL org.opencontainers.image.title="aleph-e1" \
      org.opencontainers.image.description="AlephLM-0 E1 environment and training module" \
      org.opencontainers.image.revision="${ALEPH_REVISION}" \
      org.opencontainers.image.base.name="nvidia/cuda:12.4.1-cudnn-devel-ubuntu22.04"
RUN set -eux; \
    if [ -z "${ALEPH_REVISION:-}" ]; then echo "build with --build-arg ALEPH_REVISION=\$(git rev-parse HEAD)" >&2; exit 1; fi; \
    printf '%s\n' "${ALEPH_REVISION}" > aleph/REVISION; \
    install -m 0755 docker/aleph /usr/local/bin/aleph; \
    python3 -m compileall -q aleph; \
    PYTHONDONTWRITEBYTECODE=1 aleph env check --strict

USER ${ALEPH_UID}:${ALEPH_UID}
ENTRYPOINT ["/usr/bin/tini", "--", "/opt/aleph/docker/entrypoint.sh"]
CMD ["aleph", "env", "check"]

# rtvideo on NGC's Triton containers: tritonserver is on PATH there, so `rtvideo serve` starts it
# directly (no nvidia-pytriton wheel) and runs the WebSocket proxy in front of it. Two images:
#
#   docker build -t rtvideo-omni .                 # default target `vllm-omni`: GPU, vLLM-Omni (Helios)
#   docker build --build-arg VLLM_OMNI_VERSION=0.32.0rc1 \
#     --build-arg VLLM_OMNI_LOCK=deploy/gpu/vllm-omni-0.32/requirements.lock -t rtvideo-omni:0.32rc1 .
#                                                  # the same on vLLM-Omni 0.32.0rc1, a RELEASE CANDIDATE
#                                                  # (its engine pauses paced sessions); 0.30.0 stays
#                                                  # the default until 0.32.0 is released
#   docker build --target cpu -t rtvideo .         # the built-in generator (CPU, or CUDA when visible)
#
#   docker run --gpus all --shm-size=1g -p 8080:8080 \
#     -v "$HOME/.cache/huggingface:/home/rtvideo/.cache/huggingface" rtvideo-omni
#
# 8080: WebSocket proxy, demo page, /healthz /readyz /livez /metrics
# 8081: /healthz /readyz /livez /metrics alone, on a listener with its own connection bound
#       (RTVIDEO_HEALTH_PORT): probes and scrapes are answered while 8080's connections are all taken
# Only 8080 is published. Triton listens on the container's loopback with a key generated at
# start (docs/security.md). To let direct tritonclient users in (opt-in; they send the key as a
# header), give Triton a key and every address, and publish its gRPC (8001) and metrics (8002):
#   docker run ... -e RTVIDEO_TRITON_HOST=0.0.0.0 -e RTVIDEO_TRITON_KEY="$(openssl rand -hex 32)" \
#     -p 8080:8080 -p 8001:8001 -p 8002:8002 rtvideo-omni
# (`rtvideo serve` refuses a published Triton without a key, and warns for a release before 25.07.)
# Triton's Python backend passes tensors through /dev/shm: give the container at least 1 GiB.
# The vllm-omni image downloads nothing at run time (HF_HUB_OFFLINE=1): mount the model's weights
# (the Hugging Face cache above, or a directory and `--vllm-omni-model /models/Helios-Distilled`).

# The base of both images. NGC 25.07 or later: earlier Triton releases carry the Python backend's
# shared-memory CVEs (CVE-2025-23319/23320/23334, NVIDIA's bulletin of August 2025). Its Python
# (CPython 3.12, Ubuntu 24.04, x86_64) is what deploy/gpu/requirements.lock was resolved for: a
# base with another Python needs the lock regenerated (scripts/lock_vllm_image.sh).
ARG TRITON_IMAGE=nvcr.io/nvidia/tritonserver:25.07-py3

# --- the project's files, copied once for both images --------------------------------------------
FROM scratch AS source
COPY pyproject.toml README.md /src/
COPY rtvideo /src/rtvideo
COPY proxy /src/proxy
COPY client /src/client
COPY model_repository /src/model_repository

# --- cpu: the built-in generator ------------------------------------------------------------------
FROM ${TRITON_IMAGE} AS cpu

ENV PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    RTVIDEO_HEALTH_PORT=8081
WORKDIR /opt/rtvideo
COPY --from=source /src ./
# The container's Python runs the backend stub, so the package goes into it (a CUDA build of
# torch from the registry on this GPU image), with the shared session store's client
# (`--session-store redis://...` imports it at start) and aiortc for WHEP viewers. Then an unprivileged user to run as.
# DL3013: "." is this checkout, whose dependencies pyproject.toml bounds.
# hadolint ignore=DL3013
RUN python3 -m pip install --no-cache-dir ".[proxy,backend,redis,webrtc]" \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin rtvideo

USER 10001
# Only the proxy's port: Triton's are published only on the deployer's say (above).
EXPOSE 8080
# /healthz, not /readyz: a server with every connection in use is full, not unhealthy (an
# orchestrator that replaces unhealthy containers would end every live session). On the health
# listener (8081), which idle connections to 8080 cannot starve; without the token it answers
# the status alone.
HEALTHCHECK --interval=10s --timeout=5s --start-period=180s --retries=3 \
    CMD ["python3", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8081/healthz', timeout=4).status != 200)"]
ENTRYPOINT ["rtvideo", "serve"]
# The proxy on every address, Triton on loopback (RTVIDEO_TRITON_HOST publishes it, with a key);
# Triton's log (with the model's per-session lines) on standard error, for `docker logs`.
CMD ["--host", "0.0.0.0", "--port", "8080", "--triton-log", "-"]

# --- vllm-omni: the production GPU image (default target) -----------------------------------------
FROM ${TRITON_IMAGE} AS vllm-omni
# Keep equal to PINNED_VLLM_OMNI in rtvideo/backend/vllm_omni/, scripts/setup.sh and
# deploy/gpu/requirements.in.
ARG VLLM_OMNI_VERSION=0.30.0
# The lock the image installs: deploy/gpu/requirements.lock for 0.30.0 (the default), or the
# 0.32.0rc1 release candidate's deploy/gpu/vllm-omni-0.32/requirements.lock (both made by
# scripts/lock_vllm_image.sh; the grep below refuses a version the lock does not carry).
ARG VLLM_OMNI_LOCK=deploy/gpu/requirements.lock

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PIP_NO_CACHE_DIR=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    RTVIDEO_HEALTH_PORT=8081
WORKDIR /opt/rtvideo
COPY --from=source /src ./
COPY deploy/gpu/requirements.lock deploy/gpu/lingbot_world_stepwise.yaml deploy/gpu/lingbot_world_h100_fp8.yaml ./deploy/gpu/
COPY deploy/gpu/vllm-omni-0.32/requirements.lock ./deploy/gpu/vllm-omni-0.32/
COPY scripts/check_vllm_image.py ./scripts/
# The GPU check (docs/vllm-omni.md): `bash scripts/gpu_check.sh` inside the image fails unless
# the engine path works and runs in real time (the model's first-chunk budget and fps).
COPY scripts/gpu_check.sh ./scripts/
COPY benchmarks ./benchmarks/
# No Triton image carries vLLM 0.30 (Triton's compatibility matrix ends at 26.08-vllm-python-py3 =
# vLLM 0.27.1), so vLLM comes from the lock too: every package vllm + vllm-omni + rtvideo's
# runtime need, at the versions pip's resolver chose for this Python and platform
# (scripts/lock_vllm_image.sh), hash-checked, installed without resolving (--no-deps: nothing
# moves under vLLM). torch is the lock's, not any torch the base's Python may have: the PyPI
# wheel vLLM 0.30 pins (2.13.0, a CUDA 13.0 build whose CUDA libraries are the lock's nvidia-*
# wheels; the host's driver must be r580 or later). --ignore-installed: what the image already
# has (Ubuntu's packages, which pip cannot uninstall) stays in place, and the lock's version, in
# /usr/local/lib/python3.12/dist-packages, comes first on the path (the check reads the version
# that Python sees); the image's packages that the lock does not name are kept as they are
# (their list before the install: /opt/rtvideo/image-packages.txt). rtvideo goes in without
# dependencies. The check then fails the build unless every package is at the lock's version,
# every requirement of vllm-omni and vLLM (and of theirs, with markers for this Python) is met,
# and vLLM and vllm-omni agree on major.minor.
# DL3013: "." is this checkout; everything else is pinned with hashes by the lock.
# hadolint ignore=DL3013
RUN python3 -m pip list --format=freeze > /opt/rtvideo/image-packages.txt \
    && grep -q "^vllm-omni==${VLLM_OMNI_VERSION} " "${VLLM_OMNI_LOCK}" \
    && python3 -m pip install --no-cache-dir --no-deps --ignore-installed --require-hashes \
      -r "${VLLM_OMNI_LOCK}" \
    && python3 -m pip install --no-cache-dir --no-deps . \
    && python3 scripts/check_vllm_image.py "${VLLM_OMNI_LOCK}" \
    && python3 -m rtvideo.backend.loading.derive /opt/rtvideo/models generator=vllm_omni \
      width=640 height=384 fps=16 frames_per_chunk=33 max_sessions=1 \
      vllm_omni_model=BestWishYsh/Helios-Distilled \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin rtvideo

USER 10001
# Only the proxy's port: Triton's are published only on the deployer's say (above).
EXPOSE 8080
# Loading the engine takes minutes (weights, compilation): a long start period. /healthz, as in
# the cpu image: a full server (max_sessions=1 here) is not unhealthy.
HEALTHCHECK --interval=10s --timeout=5s --start-period=1200s --retries=3 \
    CMD ["python3", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8081/healthz', timeout=4).status != 200)"]
ENTRYPOINT ["rtvideo", "serve"]
CMD ["--host", "0.0.0.0", "--port", "8080", "--triton-log", "-", "--model-repository", "/opt/rtvideo/models"]

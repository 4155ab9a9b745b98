# rtvideo on NGC's Triton container: tritonserver is on PATH there, so `rtvideo serve` starts it
# directly (no nvidia-pytriton wheel) and runs the WebSocket proxy in front of it.
#
#   docker build -t rtvideo .
#   docker run --gpus all --shm-size=1g -p 8080:8080 -p 8001:8001 -p 8002:8002 rtvideo
#
# 8080: WebSocket proxy, demo page, /healthz /readyz /livez /metrics
# 8001: Triton gRPC, for direct tritonclient streaming users; 8002: Triton metrics (Prometheus)
# Triton's Python backend passes tensors through /dev/shm: give the container at least 1 GiB.
ARG TRITON_IMAGE=nvcr.io/nvidia/tritonserver:24.08-py3
FROM ${TRITON_IMAGE}

ENV PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1
WORKDIR /opt/rtvideo
COPY pyproject.toml README.md ./
COPY rtvideo ./rtvideo
COPY proxy ./proxy
COPY client ./client
COPY model_repository ./model_repository
# The container's Python runs the backend stub, so the package goes into it (a CUDA build of
# torch from the registry on this GPU image). Then an unprivileged user to run as.
# DL3013: "." is this checkout, whose dependencies pyproject.toml bounds.
# hadolint ignore=DL3013
RUN python3 -m pip install --no-cache-dir ".[proxy,backend]" \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin rtvideo

USER 10001
EXPOSE 8080 8001 8002
# /healthz, not /readyz: a server with every connection in use is full, not unhealthy (an
# orchestrator that replaces unhealthy containers would end every live session).
HEALTHCHECK --interval=10s --timeout=5s --start-period=180s --retries=3 \
    CMD ["python3", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4).status != 200)"]
ENTRYPOINT ["rtvideo", "serve"]
# Triton on every address so its gRPC and metrics ports can be published; its log (with the
# model's per-session lines) on standard error, for `docker logs` / `kubectl logs`.
CMD ["--host", "0.0.0.0", "--port", "8080", "--triton-host", "0.0.0.0", "--triton-log", "-"]

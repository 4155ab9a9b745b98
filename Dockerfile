# Production image on the NGC Triton container: tritonserver is on PATH there, so
# `rtvideo serve` starts it directly (no nvidia-pytriton wheel needed) plus the proxy.
#   docker build -t rtvideo .
#   docker run --gpus all -p 8080:8080 rtvideo
ARG TRITON_IMAGE=nvcr.io/nvidia/tritonserver:24.08-py3
FROM ${TRITON_IMAGE}

ENV PIP_NO_CACHE_DIR=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1
WORKDIR /opt/rtvideo
COPY pyproject.toml README.md ./
COPY rtvideo ./rtvideo
COPY proxy ./proxy
COPY client ./client
COPY model_repository ./model_repository
# The container's Python runs the backend stub, so the package goes into it; the
# GPU image takes a CUDA build of torch from the registry.
RUN python3 -m pip install --upgrade pip && python3 -m pip install .

EXPOSE 8080
# Triton's own ports stay inside the container unless published: 8001 (gRPC for
# direct tritonclient users), 8000 (HTTP), 8002 (metrics).
CMD ["rtvideo", "serve", "--host", "0.0.0.0", "--port", "8080", "--model-repository", "/opt/rtvideo/model_repository"]

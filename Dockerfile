# Serves the embedded default on port 8000. Installs with the README's command
# (`make install`, which `make serve` runs first) and builds the default repository at
# image build time, so that the container starts in seconds.
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends make \
    && rm -rf /var/lib/apt/lists/*
# torch==2.13.0 resolves to the CPU wheel from this index (PyPI's own torch is a CUDA
# build: `--build-arg PIP_EXTRA_INDEX_URL=` makes the GPU image, deploy/kubernetes).
ARG PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_EXTRA_INDEX_URL=${PIP_EXTRA_INDEX_URL} \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    DISTILSERVE_HOST=0.0.0.0 DISTILSERVE_PORT=8000
# the code and its virtual environment belong to root: the user the service runs as
# reads them and cannot change them (its own files: the embedded default, in its home)
WORKDIR /opt/distilserve
COPY . .
RUN make install \
    && .venv/bin/python -m compileall -q distilserve loadtests
RUN useradd --create-home app
USER app
RUN .venv/bin/python -c "from distilserve.server.embedded_default import ensure_default_repository as build; from distilserve.server.settings import Settings; build(Settings().cache_dir)"
# SageMaker runs the image as `docker run IMAGE serve`: deploy/sagemaker/serve (port 8080)
ENV PATH=/opt/distilserve/deploy/sagemaker:${PATH}
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD python3 -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/ready' % os.environ.get('DISTILSERVE_PORT', '8000'), timeout=2)"
# the server itself as PID 1 (not make), so that docker stop's SIGTERM reaches its drain
CMD ["/opt/distilserve/.venv/bin/distilserve", "serve"]

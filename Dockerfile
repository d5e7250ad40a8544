# The same install steps as the README (`make install`, which `make serve` runs first).
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends make && rm -rf /var/lib/apt/lists/*
# torch==2.13.0 resolves to the CPU wheel from this index (a plain PyPI torch is CUDA).
ENV PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
RUN useradd --create-home app
WORKDIR /home/app/distilserve
COPY --chown=app:app . .
USER app
RUN make install
EXPOSE 8000
CMD ["make", "serve"]

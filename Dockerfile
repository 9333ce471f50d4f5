# Hugging Face Docker Space / local image. Built with the same scripts/setup.sh that `make` and CI use.
FROM python:3.11-slim

# gcc + libc6-dev: kernels/codes4_cpu.c, attention on 4-bit codes, is compiled on the machine that runs it.
RUN apt-get update && apt-get install -y --no-install-recommends make gcc libc6-dev && rm -rf /var/lib/apt/lists/*
RUN useradd --create-home --uid 1000 user
USER user
ENV HOME=/home/user \
    CODECKV_CACHE=/home/user/.cache/codeckv \
    HF_HUB_OFFLINE=1 \
    GRADIO_SERVER_NAME=0.0.0.0 \
    PATH=/home/user/app/.venv/bin:$PATH
WORKDIR /home/user/app

COPY --chown=user requirements.txt requirements-dev.txt requirements-peers.txt requirements-cluster.txt ./
COPY --chown=user scripts/ scripts/
RUN scripts/setup.sh
COPY --chown=user . .
# Convert the embedded GGUF model once at build time, so the Space starts in seconds.
RUN scripts/setup.sh --convert

EXPOSE 7860
CMD ["python", "app.py"]

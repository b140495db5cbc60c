# syntax=docker/dockerfile:1
# llm-prober container: a Prometheus exporter that probes OpenAI-compatible LLM endpoints.
#
#   docker build -t llm-prober .
#   docker run --read-only --tmpfs /tmp -p 9470:9470 \
#     -v "$PWD/config.yml:/etc/llm-prober/config.yml:ro" llm-prober
#
# Runs as an unprivileged numeric user (Kubernetes runAsNonRoot can verify it) and needs no
# writable path: bytecode is compiled at build time and never written at run time.

# Python 3.12, not the 3.11 the tests also run on: from 3.12 aiohttp writes a request in the
# task that sends it instead of one loop iteration later, which cut dispatch lag p99 at 200
# requests/s from 3.2-4.2 to 1.8-2.9 ms in interleaved runs (docs/performance.md).
ARG PYTHON_IMAGE=python:3.12-slim

# --- build: install the package and its dependencies into a self-contained virtualenv ----
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
WORKDIR /src
# README* (a glob): setuptools reads the readme into the metadata, but a checkout without it
# must still build. The `fast` extra (uvloop, orjson) is what the daemon's stamp accuracy was
# measured with (docs/performance.md); both ship wheels for amd64 and arm64.
COPY pyproject.toml README* ./
COPY prober ./prober
RUN pip install --no-cache-dir "./[fast]" \
    && python -m compileall -q /opt/venv

# --- runtime: the virtualenv only, no compiler, no pip cache, no source tree --------------
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="llm-prober" \
      org.opencontainers.image.description="Prometheus exporter measuring OpenAI-compatible LLM endpoints with streaming probes" \
      org.opencontainers.image.source="https://github.com/llm-prober/llm-prober" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN groupadd --system --gid 10001 prober \
    && useradd --system --uid 10001 --gid prober --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin prober
COPY --from=build /opt/venv /opt/venv
USER 10001:10001
EXPOSE 9470
# slim has no curl: ask the daemon with the standard library. Assumes the default listen
# port; a config that moves it should override the health check too.
HEALTHCHECK --interval=30s --timeout=5s --start-period=15s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:9470/-/healthy', timeout=4).status == 200 else 1)"]
ENTRYPOINT ["llm-prober"]
CMD ["run", "--config", "/etc/llm-prober/config.yml"]

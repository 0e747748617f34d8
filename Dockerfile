# contextshift serve in a container. Two stages: the wheel is built by maturin where the Rust
# toolchain and a C compiler are, and only the wheel (with its server and PostgreSQL extras) goes
# into a slim runtime, run as a user of its own. deploy/kubernetes runs this image.
#
#   docker build -t contextshift:0.1.0 .
#   docker run -p 50051:50051 -p 8080:8080 -e CONTEXTSHIFT_STORE=postgresql://... contextshift:0.1.0
#
# Containers cannot run on the machines this project is built on: tests/test_deploy.py checks this
# file against the server's real ports, settings and health routes instead (docs/deployment.md).

FROM rust:1.95-slim-bookworm AS builder
# Debian 12's Python 3.11, the runtime's minor version: the wheel is built for cp311. The core
# links the system's libsqlite3 (the one Python's sqlite3 module loads: one SQLite per process).
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-dev python3-venv libsqlite3-dev \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/maturin && /opt/maturin/bin/pip install --no-cache-dir maturin==1.16.0
WORKDIR /src
COPY Cargo.toml Cargo.lock pyproject.toml README.md ./
COPY rust_ext rust_ext
COPY benchmarks/rust benchmarks/rust
COPY service service
# No auditwheel repair (pyproject.toml): the wheel links the runtime image's libsqlite3-0.
RUN /opt/maturin/bin/maturin build --release --interpreter python3 --out /wheels

FROM python:3.11-slim-bookworm
COPY --from=builder /wheels /wheels
RUN pip install --no-cache-dir "$(ls /wheels/contextshift-*.whl)[postgres]" && rm -rf /wheels \
    && useradd --system --uid 10001 --user-group --home-dir /data --create-home contextshift
# Listen on every interface of the container; SQLite (the default store, one container) under
# /data; PostgreSQL for replicas: CONTEXTSHIFT_STORE=postgresql://user:password@host:5432/db.
ENV CONTEXTSHIFT_HOST=0.0.0.0 \
    XDG_DATA_HOME=/data \
    PYTHONUNBUFFERED=1
USER contextshift
WORKDIR /data
VOLUME /data
# gRPC, then HTTP/JSON with /healthz, /readyz and /metrics.
EXPOSE 50051 8080
# Liveness: the process answers (readiness, /readyz, is for balancers: it fails while the store
# does not answer and from SIGTERM on).
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2)"]
ENTRYPOINT ["contextshift"]
CMD ["serve"]

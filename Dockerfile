# Berth's container image: the `berth` binary (serve, worker, migrate, admin) on Debian slim.
# It matches charts/berth's defaults: runs as user 10001, `berth` is on PATH, and the only
# paths it writes are /var/lib/berth (BERTH_DATA_DIR) and /tmp, so the API pods can keep a
# read-only root filesystem.
#
#   docker build -t berth:dev .     (or: podman build / buildah bud)
#   docker run --rm berth:dev --version

FROM docker.io/library/rust:1-bookworm AS build
WORKDIR /src
# Dependencies first, so that a source change does not rebuild them: build against
# stub sources with the real manifests and lock file.
COPY Cargo.toml Cargo.lock ./
COPY server/protocol/Cargo.toml server/protocol/
COPY server/client/Cargo.toml server/client/
COPY server/store/Cargo.toml server/store/
COPY server/api/Cargo.toml server/api/
COPY server/worker/Cargo.toml server/worker/
COPY server/berth/Cargo.toml server/berth/
COPY tests/Cargo.toml tests/
RUN for d in server/protocol server/client server/store server/api server/worker tests; do \
      mkdir -p $d/src && echo '' > $d/src/lib.rs; done \
 && mkdir -p server/berth/src && echo 'fn main() {}' > server/berth/src/main.rs \
 && cargo fetch --locked
COPY . .
# `touch` makes cargo rebuild the real sources over the stubs' fingerprints.
RUN find server tests -name '*.rs' -exec touch {} + \
 && cargo build --release --locked -p berth \
 && install -m 0755 target/release/berth /usr/local/bin/berth

FROM docker.io/library/debian:bookworm-slim
# ca-certificates: TLS to PostgreSQL and object storage with system roots; git, bash and
# procps: the worker's agent runs shell tools in the workspace; tini reaps the processes
# those tools leave behind and forwards signals (Berth drains on SIGTERM).
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates git bash procps tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 berth \
 && useradd --uid 10001 --gid 10001 --home-dir /var/lib/berth --shell /bin/bash --no-create-home berth \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/berth /workspaces
COPY --from=build /usr/local/bin/berth /usr/local/bin/berth
ENV BERTH_DATA_DIR=/var/lib/berth \
    BERTH_LISTEN=0.0.0.0:8790 \
    BERTH_METRICS_LISTEN=0.0.0.0:9464 \
    HOME=/var/lib/berth
WORKDIR /var/lib/berth
USER 10001:10001
EXPOSE 8790 9464
ENTRYPOINT ["/usr/bin/tini", "--", "berth"]
CMD ["serve"]

# Berth's container image: the `berth` binary (serve, worker, migrate, admin) on Debian slim.
# It matches charts/berth's defaults: runs as user 10001, `berth` is on PATH, and the only
# paths it writes are /var/lib/berth (BERTH_DATA_DIR) and /tmp, so the API pods can keep a
# read-only root filesystem.
#
#   docker build -t berth:dev .     (or: podman build / buildah bud)
#   docker run --rm berth:dev --version

# The build toolchain is the workspace's rust-version (Cargo.toml), so the image checks it.
# Tags, not digests: no registry was reachable where this was written to read the digests;
# pin them (`docker buildx imagetools inspect <tag>`) when you build for production.
FROM docker.io/library/rust:1.91-bookworm AS build
WORKDIR /src
COPY . .
# Cache mounts keep the crate registry and the build directory between builds (BuildKit,
# buildah and podman); the binary is copied out of the cached target directory.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p berth \
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

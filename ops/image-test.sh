#!/usr/bin/env bash
# Builds the runtime stage of ./Dockerfile with podman and checks what the chart relies on:
# `berth --version` runs through the image's entrypoint, as user 10001, with `berth` on PATH
# and /var/lib/berth and /tmp writable. Run by .ci/run: ops/image-test.sh PATH/TO/berth
#
# Why only the runtime stage: the Dockerfile's base images come from Docker Hub, which this
# CI cannot reach, and Debian's Rust (1.63 in bookworm) is older than the workspace needs.
# So the base is made here from Debian's packages (mmdebstrap) and the binary is the one CI
# just built; the stage's own lines (packages, user, paths, environment, entrypoint) are
# taken from the Dockerfile unchanged, except the FROM line and the COPY of the binary.
#
# Podman here: isolation "chroot" for the build (no cgroups needed), runc for `run` (crun refuses this host's hybrid cgroup layout), and
# ulimits at or below the host's hard limits (raising them needs CAP_SYS_RESOURCE).
set -euo pipefail
cd "$(dirname "$0")/.."
binary=${1:?usage: ops/image-test.sh PATH/TO/berth}
store=${BERTH_CI_CONTAINERS:-/var/tmp/berth-ci-containers}
run_root=${TMPDIR:-/tmp}/berth-ci-podman-run
podman=(podman --root "$store/storage" --runroot "$run_root" --storage-driver overlay
  --cgroup-manager cgroupfs --runtime runc)
limits=(--ulimit nofile=1024:1024 --ulimit nproc=1024:1024)
base=localhost/berth-ci/debian:bookworm
image=localhost/berth-ci/berth:test

if ! "${podman[@]}" image exists "$base"; then
  echo "image-test: making the Debian base from Debian's packages (mmdebstrap)"
  mkdir -p "$store"
  mmdebstrap --quiet --variant=minbase --mode=root bookworm "$store/base.tar" http://deb.debian.org/debian
  "${podman[@]}" import "$store/base.tar" "$base" >/dev/null
  rm -f "$store/base.tar"
fi

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
# The Dockerfile's last stage, from its FROM line to the end.
start=$(grep -n '^FROM ' Dockerfile | tail -1 | cut -d: -f1)
tail -n "+$start" Dockerfile \
  | sed -e "1s|^FROM .*|FROM $base|" \
        -e 's|^COPY --from=build /usr/local/bin/berth /usr/local/bin/berth$|COPY berth /usr/local/bin/berth|' \
  > "$ctx/Containerfile"
grep -q '^COPY berth /usr/local/bin/berth$' "$ctx/Containerfile" \
  || { echo "image-test: the Dockerfile's last stage no longer copies /usr/local/bin/berth from the build stage" >&2; exit 1; }
install -m 0755 "$binary" "$ctx/berth"

echo "image-test: building the runtime stage"
"${podman[@]}" build --quiet --isolation chroot --network host "${limits[@]}" -t "$image" "$ctx" >/dev/null

run() { "${podman[@]}" run --rm --network none "${limits[@]}" "$@"; }
passed=0
check() {
  local what=$1 want=$2 got=$3
  if [ "$got" != "$want" ]; then
    echo "image-test: FAIL $what: want '$want', got '$got'" >&2
    echo "image-test: $passed passed, 1 failed"
    exit 1
  fi
  echo "ok   image: $what"
  passed=$((passed + 1))
}
# The chart's default image tag is its appVersion.
app_version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/berth/Chart.yaml)
check "berth --version through the entrypoint is the chart's appVersion" "berth $app_version" \
  "$(run "$image" --version)"
check "runs as user 10001" "10001:10001" "$(run --entrypoint /bin/sh "$image" -c 'echo "$(id -u):$(id -g)"')"
check "berth is on PATH" "/usr/local/bin/berth" "$(run --entrypoint /bin/sh "$image" -c 'command -v berth')"
check "BERTH_DATA_DIR is /var/lib/berth and writable" "/var/lib/berth ok" \
  "$(run --entrypoint /bin/sh "$image" -c 'touch "$BERTH_DATA_DIR/x" && echo "$BERTH_DATA_DIR ok"')"
# The chart mounts /var/lib/berth and /tmp and makes the root read-only: nothing else is needed.
check "starts with a read-only root and only /var/lib/berth and /tmp writable" "ok" \
  "$(install -d -o 10001 -g 10001 "$ctx/data" && run --read-only --tmpfs /tmp -v "$ctx/data:/var/lib/berth" \
      --entrypoint /bin/sh "$image" \
      -c 'berth --help >/dev/null && touch /tmp/x /var/lib/berth/x && ! touch /usr/x 2>/dev/null && echo ok')"
echo "image-test: $passed passed, 0 failed"

#!/usr/bin/env bash
# A private container engine for the docker backend's real-engine tests and benchmarks, started by
# hand on a Debian host (root) and torn down afterwards: nothing of it stays on the machine.
#
#   scripts/private-engine.sh start DIR [docker|podman]   prints the variables to export (DOCKER_HOST, ...)
#   scripts/private-engine.sh stop DIR                    ends the daemon, unmounts, removes DIR
#   scripts/private-engine.sh base DIR TAG                imports the stand-in base image as TAG
#
# docker: Debian's dockerd with its own data root, exec root, socket and pid file in DIR, no bridge
#   and no iptables rules of its own (`--bridge=none --iptables=false`): containers and builds run
#   without network (dlbench runs workers with `--network none` and builds offline from a wheelhouse).
# podman: podman with its storage in DIR, runc (crun fails on cgroup v1 hosts) and explicit ulimits
#   (without CAP_SYS_RESOURCE in the host's namespace podman cannot raise them to its defaults),
#   configured through CONTAINERS_CONF / CONTAINERS_STORAGE_CONF files in DIR; its docker-API socket
#   (`podman system service`) in DIR as well, for the docker CLI.
# The stand-in base: no registry is reachable here, so the images' base (a build argument of every
#   Dockerfile) is a Debian bookworm made by mmdebstrap, with Python 3.11, pip and venv, the CA
#   bundle, and the OpenMP and quad-precision runtimes mxnet's wheel loads (libgomp1, libquadmath0).
# Where a system dockerd runs beside it (GitHub's runners), the private one keeps to containerd
#   namespaces of its own; the socket belongs to the calling user's group (sudo from a plain user).
set -euo pipefail

usage() { echo "usage: $0 start DIR [docker|podman] | stop DIR | base DIR TAG" >&2; exit 2; }
[ $# -ge 2 ] || usage
action=$1 dir=$(realpath -m "$2")

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi; }

install_missing() {  # command package...
  local cmd=$1; shift
  command -v "$cmd" >/dev/null 2>&1 && return 0
  command -v apt-get >/dev/null 2>&1 || { echo "private-engine: no $cmd and no apt-get to install it" >&2; return 1; }
  echo "private-engine: installing $* (apt-get)" >&2
  { as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends "$@"; } >/dev/null 2>&1
}

wait_for() {  # seconds command...
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.2
  done
}

podman_config() {
  cat > "$dir/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
init_path = "$(command -v catatonit || echo /usr/libexec/podman/catatonit)"
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
[network]
network_config_dir = "$dir/podman-networks"
EOF
  cat > "$dir/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$dir/podman-root"
runroot = "$dir/podman-run"
EOF
  echo "export CONTAINERS_CONF=$dir/containers.conf CONTAINERS_STORAGE_CONF=$dir/storage.conf"
}

case $action in
  start)
    kind=${3:-docker}
    mkdir -p "$dir"
    if [ "$kind" = docker ]; then
      install_missing dockerd docker.io
      as_root dockerd --data-root "$dir/data" --exec-root "$dir/exec" -H "unix://$dir/docker.sock" \
        --pidfile "$dir/dockerd.pid" --group "$(id -gn)" --bridge=none --iptables=false --ip-masq=false --ip-forward=false \
        --storage-driver overlay2 --containerd-namespace dlbench-private \
        --containerd-plugins-namespace dlbench-private-plugins >"$dir/dockerd.log" 2>&1 &
      if ! { wait_for 60 test -S "$dir/docker.sock" \
             && wait_for 60 env DOCKER_HOST="unix://$dir/docker.sock" docker version; }; then
        echo "private-engine: dockerd did not come up; $dir/dockerd.log:" >&2; tail -20 "$dir/dockerd.log" >&2; exit 1
      fi
      echo "export DOCKER_HOST=unix://$dir/docker.sock"
    elif [ "$kind" = podman ]; then
      install_missing podman podman catatonit runc
      podman_config > "$dir/podman.env"
      # shellcheck disable=SC1091
      source "$dir/podman.env"
      podman system service --time 0 "unix://$dir/podman.sock" >"$dir/podman-service.log" 2>&1 &
      echo $! > "$dir/podman-service.pid"
      wait_for 60 test -S "$dir/podman.sock" \
        || { echo "private-engine: podman's service did not come up" >&2; tail -20 "$dir/podman-service.log" >&2; exit 1; }
      cat "$dir/podman.env"
      echo "export DLBENCH_PODMAN_SOCKET=unix://$dir/podman.sock"
    else
      usage
    fi ;;
  base)
    [ $# -eq 3 ] || usage
    tag=$3
    install_missing mmdebstrap mmdebstrap debian-archive-keyring
    if [ ! -s "$dir/base.tar" ]; then
      as_root mmdebstrap --quiet --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates,libgomp1,libquadmath0 \
        bookworm "$dir/base.partial.tar" && mv "$dir/base.partial.tar" "$dir/base.tar"  # mmdebstrap picks its output format by the extension
    fi
    if [ -n "${CONTAINERS_CONF:-}" ] && [ -z "${DOCKER_HOST:-}" ]; then
      podman import --quiet "$dir/base.tar" "$tag" >/dev/null
    else
      docker import --change 'CMD ["python3"]' "$dir/base.tar" "$tag" >/dev/null
    fi ;;
  stop)
    # the docker daemon: its containers first, then the daemon by its pid file
    if [ -S "$dir/docker.sock" ]; then
      DOCKER_HOST="unix://$dir/docker.sock" docker ps -aq 2>/dev/null | while read -r id; do
        DOCKER_HOST="unix://$dir/docker.sock" docker rm -f "$id" >/dev/null 2>&1 || true
      done
    fi
    for pidfile in "$dir/dockerd.pid" "$dir/podman-service.pid"; do
      [ -f "$pidfile" ] || continue
      pid=$(cat "$pidfile")
      as_root kill "$pid" 2>/dev/null || true
      wait_for 30 sh -c "! kill -0 $pid" || as_root kill -9 "$pid" 2>/dev/null || true
    done
    if [ -f "$dir/podman.env" ]; then
      # shellcheck disable=SC1091
      source "$dir/podman.env"
      podman rm --all --force >/dev/null 2>&1 || true
      podman system reset --force >/dev/null 2>&1 || true
    fi
    # whatever is still mounted under DIR (overlay layers, the exec root's netns and shm), deepest first
    awk -v d="$dir" '$2 == d || index($2, d "/") == 1 {print $2}' /proc/mounts | sort -r \
      | while read -r m; do as_root umount -l "$m" 2>/dev/null || true; done
    as_root rm -rf "$dir"
    left=$(awk -v d="$dir" 'index($2, d) == 1' /proc/mounts | wc -l)
    [ "$left" = 0 ] || { echo "private-engine: $left mounts under $dir remain" >&2; exit 1; } ;;
  *) usage ;;
esac

#!/usr/bin/env bash
# Rootless ironlet against rootless podman (issue 16, "Benchmark"), side by side in one run,
# interleaved, as an unprivileged user with a subordinate id range that this script creates
# (and removes, with everything it made):
#   ctr    `ironlet ctr run --rm busybox -- true`   vs `podman run --rm busybox true`
#   ctrhost the same with --net-host / --network host
#   play   `ironlet play -d pod.yaml` until READY 1/1 vs `podman kube play pod.yaml` (returns
#          once the containers run), with the pod network (pasta / podman's default,
#          slirp4netns in Debian 12's 4.3) and without (--no-pod-network / --network none)
# Same image in both: images/out/busybox.oci.tar, `ironlet images import` and `podman load`.
# crun is podman's runtime. On this cgroup v1 hybrid machine crun refuses to run while the
# v2 hierarchy has a controller, so the run happens in a private mount namespace with a
# tmpfs over /sys/fs/cgroup/unified (as bench/src/peer_bundle.rs does); rootless on v1 neither
# uses cgroups (podman: cgroups = "disabled"). Installs Debian's podman if missing.
#
# Usage (root): bench/podman-rootless.sh IRONLET [ITERATIONS_CTR] [ITERATIONS_PLAY]
#   IRONLET: the ironlet binary to time; IRONLET_PLAY_NET=BIN times `play` with the pod
#   network with BIN instead (a build whose play has rootless networking).
set -euo pipefail
cd "$(dirname "$0")/.."

ironlet=$(realpath "${1:?usage: $0 IRONLET [ITERATIONS_CTR] [ITERATIONS_PLAY]}")
n_ctr=${2:-50}
n_play=${3:-10}
play_net_bin=$(realpath "${IRONLET_PLAY_NET:-$ironlet}")
image_tar=images/out/busybox.oci.tar
[ "$(id -u)" -eq 0 ] || { echo "run as root (creates the test user)" >&2; exit 1; }
[ -f "$image_tar" ] || images/build

if [ -z "${BENCH_INNER:-}" ]; then
  if ! command -v podman >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      podman crun catatonit slirp4netns fuse-overlayfs uidmap >/dev/null
  fi
  user="irl-pbench-$$"
  work=$(mktemp -d /tmp/ironlet-podbench-XXXXXX)
  cleanup() {
    pkill -KILL -U "$user" 2>/dev/null || true
    sleep 0.5
    # podman's overlay mounts live in the user's namespace; they go with its processes.
    rm -rf "$work" 2>/dev/null || { sleep 1; rm -rf "$work"; }
    userdel --remove "$user" 2>/dev/null || true
  }
  trap cleanup EXIT
  trap 'exit 130' INT TERM
  range=$((60000000 + ($$ % 64) * 65536))
  useradd -K SUB_UID_COUNT=0 -K SUB_GID_COUNT=0 --home-dir "$work/home" --create-home \
    --shell /bin/sh "$user"
  usermod --add-subuids "$range-$((range + 65535))" --add-subgids "$range-$((range + 65535))" "$user"
  chmod 755 "$work"
  cp "$ironlet" "$work/home/ironlet"
  cp "$play_net_bin" "$work/home/ironlet-play-net"
  cp "$image_tar" "$work/home/busybox.oci.tar"
  chown -R "$user:" "$work/home"
  BENCH_INNER=1 BENCH_USER=$user BENCH_HOME=$work/home \
    unshare -m --propagation private "$0" "$@"
  exit
fi

mount -t tmpfs -o size=4k tmpfs /sys/fs/cgroup/unified
user=$BENCH_USER
home=$BENCH_HOME
uid=$(id -u "$user")
as() {
  setpriv --reuid "$uid" --regid "$uid" --init-groups -- \
    env -i PATH=/usr/bin:/bin:/usr/sbin:/sbin HOME="$home" XDG_RUNTIME_DIR="$home/run" "$@"
}
as mkdir -p -m 700 "$home/run" "$home/.config/containers" "$home/results"
as sh -c "printf '[engine]\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\nruntime = \"crun\"\n[containers]\ncgroups = \"disabled\"\n' > $home/.config/containers/containers.conf"
as sh -c "printf '[storage]\ndriver = \"overlay\"\n' > $home/.config/containers/storage.conf"
irl="$home/ironlet --root-dir $home/irl"
as $irl images import "$home/busybox.oci.tar" >/dev/null
as podman load -q -i "$home/busybox.oci.tar" >/dev/null

pod_yaml() { # IMAGE NAME
  cat <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $2}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: c
    image: $1
    imagePullPolicy: IfNotPresent
    command: [sh, -c, 'trap "exit 0" TERM; sleep 3600 & wait']
EOF
}
pod_yaml busybox:latest bench | as sh -c "cat > $home/irl.yaml"
pod_yaml localhost/busybox:latest bench | as sh -c "cat > $home/podman.yaml"

now() { date +%s%N; }
record() { echo $(( ($2 - $1) / 1000 )) >>"$home/results/$3"; } # START END NAME (µs)

# ironlet play -d, then `pods` on the play's socket until READY 1/1; its IP is kept.
irl_play() { # BIN NAME [FLAGS]
  local bin=$1 name=$2; shift 2
  local t0 t1 id row deadline
  t0=$(now)
  as "$bin" --root-dir "$home/irl" play -d "$@" "$home/irl.yaml" >/dev/null
  id=$(ls "$home/irl/play")
  deadline=$(( $(date +%s) + 120 ))
  until row=$(as "$bin" --root-dir "$home/irl/play/$id" pods 2>/dev/null | grep '^bench-') \
    && [ "$(echo "$row" | awk '{print $2}')" = 1/1 ]; do
    [ "$(date +%s)" -lt "$deadline" ] || { echo "play: no READY 1/1 in 120 s" >&2; exit 1; }
  done
  t1=$(now)
  record "$t0" "$t1" "$name"
  echo "$row" | awk '{print $NF}' >>"$home/results/$name.ip"
  as "$bin" --root-dir "$home/irl" play --down "$home/irl.yaml" >/dev/null
}
podman_play() { # NAME [FLAGS]
  local name=$1; shift
  local t0 t1
  t0=$(now)
  as podman kube play -q "$@" "$home/podman.yaml" >/dev/null
  t1=$(now)
  record "$t0" "$t1" "$name"
  as podman kube down "$home/podman.yaml" >/dev/null
}
timed() { # NAME CMD…
  local name=$1; shift
  local t0 t1
  t0=$(now)
  as "$@" >/dev/null 2>&1
  t1=$(now)
  record "$t0" "$t1" "$name"
}

# Warm-up: podman builds its pause image on the first pod; first runs fill caches.
podman_play warm >/dev/null; irl_play "$home/ironlet" warm --no-pod-network
timed warm podman run --rm localhost/busybox:latest true
timed warm $irl ctr run --rm busybox -- true
rm -f "$home/results/"warm*

for i in $(seq "$n_ctr"); do
  timed irl-ctr $irl ctr run --rm busybox -- true
  timed podman-ctr podman run --rm localhost/busybox:latest true
  timed irl-ctrhost $irl ctr run --rm --net-host busybox -- true
  timed podman-ctrhost podman run --rm --network host localhost/busybox:latest true
done
for i in $(seq "$n_play"); do
  irl_play "$home/ironlet" irl-play-nonet --no-pod-network
  podman_play podman-play-nonet --network none
  irl_play "$home/ironlet-play-net" irl-play-net
  podman_play podman-play-net
done

pct() { sort -n "$1" | awk -v p="$2" '{a[NR]=$1} END {i=int((NR-1)*p/100+0.5)+1; printf "%.1f", a[i]/1000}'; }
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-16s %6s %9s %9s %9s\n' case n p50_ms p90_ms p99_ms
for f in irl-ctr podman-ctr irl-ctrhost podman-ctrhost irl-play-nonet podman-play-nonet irl-play-net podman-play-net; do
  printf '%-16s %6s %9s %9s %9s\n' "$f" "$(wc -l <"$home/results/$f")" \
    "$(pct "$home/results/$f" 50)" "$(pct "$home/results/$f" 90)" "$(pct "$home/results/$f" 99)"
done
echo "ironlet play pod IPs: nonet $(sort -u "$home/results/irl-play-nonet.ip" | tr '\n' ' ')net $(sort -u "$home/results/irl-play-net.ip" | tr '\n' ' ')"
for pair in ctr ctrhost play-nonet play-net; do
  a=$(pct "$home/results/irl-$pair" 50); b=$(pct "$home/results/podman-$pair" 50)
  a99=$(pct "$home/results/irl-$pair" 99); b99=$(pct "$home/results/podman-$pair" 99)
  awk -v a="$a" -v b="$b" -v c="$a99" -v d="$b99" -v n="$pair" \
    'BEGIN {printf "ironlet/podman %-11s p50 %.2fx  p99 %.2fx\n", n, a/b, c/d}'
done

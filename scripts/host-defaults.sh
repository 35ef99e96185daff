# Sourced by scripts/test. What ironlet's own defaults create on the host when a test runs
# a container the way a user would (`ironlet ctr run -p` on ironlet's network, as podman uses
# its own): the default CNI config /etc/cni/net.d/99-ironlet.conflist, the ironlet0 bridge,
# the network's masquerade rule and chain, and the `ironlet` cgroup parent. What the suite
# finds absent at its start it removes at its end, so a run leaves nothing behind; what was
# there before (a node started with scripts/start) is left alone. Both functions always
# succeed (scripts/test runs them under `set -e`).

host_defaults_conflist=/etc/cni/net.d/99-ironlet.conflist

host_defaults_masq_rules() {
  iptables -t nat -S POSTROUTING 2>/dev/null | grep -F -- '--comment "ironlet network ironlet"' || true
}

host_defaults_snapshot() {
  had_conflist=0; had_bridge=0; had_masq=0; had_cgroup_parent=0
  if [ -e "$host_defaults_conflist" ]; then had_conflist=1; fi
  if ip link show ironlet0 >/dev/null 2>&1; then had_bridge=1; fi
  if [ -n "$(host_defaults_masq_rules)" ]; then had_masq=1; fi
  if compgen -G '/sys/fs/cgroup/*/ironlet' >/dev/null || [ -d /sys/fs/cgroup/ironlet ]; then
    had_cgroup_parent=1
  fi
  return 0
}

host_defaults_restore() {
  if [ "$had_conflist" = 0 ]; then rm -f "$host_defaults_conflist"; fi
  if [ "$had_bridge" = 0 ]; then ip link del ironlet0 2>/dev/null || true; fi
  if [ "$had_masq" = 0 ]; then
    local rule chain
    while read -r rule; do
      [ -n "$rule" ] || continue
      chain=$(sed -n 's/.* -j \(IRONLET-MASQ-[A-F0-9]*\).*/\1/p' <<<"$rule")
      eval "iptables -t nat ${rule/-A /-D }" || true
      if [ -n "$chain" ]; then
        iptables -t nat -F "$chain" 2>/dev/null || true
        iptables -t nat -X "$chain" 2>/dev/null || true
      fi
    done <<<"$(host_defaults_masq_rules)"
  fi
  if [ "$had_cgroup_parent" = 0 ]; then
    # Empty cgroups only: rmdir refuses one that still has processes or children.
    local dir
    for dir in /sys/fs/cgroup/*/ironlet /sys/fs/cgroup/ironlet; do
      if [ -d "$dir" ]; then find "$dir" -depth -type d -exec rmdir {} \; 2>/dev/null || true; fi
    done
  fi
  return 0
}

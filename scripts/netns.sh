#!/usr/bin/env bash
# Simulated multi-host, multi-rail fabric for tests: hosts ferry-h0..h<N-1>,
# each with NICs rail0 and rail1 (veth), rail r of every host on bridge br<r>
# in namespace ferry-sw. Addresses: 198.18.<r>.<h+1>/24 (RFC 2544 benchmark
# range: nothing leaves the machine).
#   scripts/netns.sh up [N]   (default 4)      scripts/netns.sh down
set -euo pipefail
cmd=${1:-up}
n=${2:-4}
down() {
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^ferry-(h[0-9]+|sw)$' || true); do
    ip netns del "$ns" 2>/dev/null || true
  done
}
if [ "$cmd" = down ]; then down; exit 0; fi
down
ip netns add ferry-sw
for r in 0 1; do
  ip -n ferry-sw link add br$r type bridge
  ip -n ferry-sw link set br$r up
done
for ((h = 0; h < n; h++)); do
  ns=ferry-h$h
  ip netns add $ns
  ip -n $ns link set lo up
  for r in 0 1; do
    ip link add rail$r netns $ns type veth peer name h${h}r$r netns ferry-sw
    ip -n $ns addr add 198.18.$r.$((h + 1))/24 dev rail$r
    ip -n $ns link set rail$r up
    ip -n ferry-sw link set h${h}r$r master br$r
    ip -n ferry-sw link set h${h}r$r up
  done
done

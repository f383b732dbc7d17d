# Sourced by the network-namespace benchmarks (netns-bench.sh, netns-hosts-bench.sh).
# Needs root and iproute2.

# netns_hosts PREFIX SUBNET COUNT RATE: a bridge in namespace PREFIXhub and COUNT host
# namespaces PREFIX0 .. PREFIX(COUNT-1) on it, host h at SUBNET.(h+1)/24 on its eth0,
# its egress limited to RATE (tc tbf, like a real NIC).
netns_hosts() {
    local p=$1 subnet=$2 count=$3 rate=$4 h
    ip netns add "${p}hub"
    ip -n "${p}hub" link add br0 type bridge
    ip -n "${p}hub" link set br0 up
    for h in $(seq 0 $((count - 1))); do
        ip netns add "${p}$h"
        ip -n "${p}$h" link set lo up
        ip -n "${p}$h" link add eth0 type veth peer name "h$h" netns "${p}hub"
        ip -n "${p}hub" link set "h$h" master br0
        ip -n "${p}hub" link set "h$h" up
        ip -n "${p}$h" addr add "$subnet.$((h + 1))/24" dev eth0
        ip -n "${p}$h" link set eth0 up
        tc -n "${p}$h" qdisc add dev eth0 root tbf rate "$rate" burst 512kb latency 100ms
    done
}

# netns_cleanup PREFIX: removes every namespace whose name starts with PREFIX.
netns_cleanup() {
    local ns
    for ns in $(ip netns list | awk '{print $1}' | grep "^$1" || true); do ip netns del "$ns"; done
}

# link_rate RATE: a tc rate (1gbit, 500mbit) in GB/s, decimal as busbw; fails otherwise.
link_rate() {
    case $1 in
    *gbit) awk -v r="${1%gbit}" 'BEGIN {print r / 8}' ;;
    *mbit) awk -v r="${1%mbit}" 'BEGIN {print r / 8000}' ;;
    *) echo "rate must end in gbit or mbit" >&2; return 2 ;;
    esac
}

#!/usr/bin/env bash
# W14 and W16 (benches/controller_throughput.rs) over runtimes and CPU conditions, in one run:
# runtimes with 1, 2 and 4 worker threads and a current_thread one; quiet, beside busy processes
# (`yes > /dev/null`, one per CPU: two on a 2-core machine), and in a cgroup whose CPU quota is
# one core (cgroup v1 or v2, where this machine lets us create one; skipped with a note otherwise).
#
#   workqueue-kube/benches/w14_matrix.sh [W14 runs] [W16 runs] [conditions] [runtimes]
#   workqueue-kube/benches/w14_matrix.sh 5 9 "quiet busy quota" "1 2 4 current_thread"
#
# `W14_BENCH=path` runs a bench binary built before (on a machine without cargo, say: build it
# with `cargo bench -p workqueue-kube --bench controller_throughput --no-run` and copy it).
# Prints each series' table and ratio lines (`RATIO ...`), prefixed with the condition.
set -euo pipefail
cd "$(dirname "$0")/../.."
w14_runs=${1:-5}
w16_runs=${2:-9}
conditions=${3:-quiet busy quota}
runtimes=${4:-1 2 4 current_thread}

# Built once, and copied: the series run this binary even if the tree changes meanwhile.
built=${W14_BENCH:-$(cargo bench -p workqueue-kube --bench controller_throughput --no-run --message-format=json |
    sed -n 's/.*"executable":"\([^"]*controller_throughput[^"]*\)".*/\1/p' | tail -1)}
bench=$(mktemp /tmp/controller_throughput.XXXXXX)
cp "$built" "$bench"
chmod +x "$bench"

# A cgroup with a one-core CPU quota, if one can be made here; its `cgroup.procs` on stdout.
quota_cgroup() {
    local dir
    if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
        dir=/sys/fs/cgroup/workqueue-w14
        mkdir -p "$dir" 2>/dev/null && echo "100000 100000" >"$dir/cpu.max" 2>/dev/null || return 1
    else
        dir=/sys/fs/cgroup/cpu/workqueue-w14
        mkdir -p "$dir" 2>/dev/null && echo 100000 >"$dir/cpu.cfs_period_us" 2>/dev/null &&
            echo 100000 >"$dir/cpu.cfs_quota_us" 2>/dev/null || return 1
    fi
    echo "$dir/cgroup.procs"
}

busy=()
stop_busy() {
    for pid in "${busy[@]}"; do kill "$pid" 2>/dev/null || true; done
    busy=()
}
trap 'stop_busy; rm -f "$bench"' EXIT

for condition in $conditions; do
    prefix=()
    case $condition in
    quiet) ;;
    busy)
        for _ in $(seq "$(nproc)"); do
            yes >/dev/null &
            busy+=($!)
        done
        ;;
    quota)
        if ! procs=$(quota_cgroup); then
            echo "== quota: no cgroup with a CPU quota can be made on this machine; skipped"
            continue
        fi
        # The bench (and the processes it starts) in the cgroup.
        prefix=(sh -c "echo \$\$ >$procs && exec \"\$0\" \"\$@\"")
        ;;
    *) echo "unknown condition $condition" >&2; exit 2 ;;
    esac
    for runtime in $runtimes; do
        echo "== $condition, W14_THREADS=$runtime, load average $(cut -d' ' -f1-3 /proc/loadavg)"
        W14_THREADS=$runtime "${prefix[@]}" "$bench" w14 100000 "$w14_runs"
        W14_THREADS=$runtime "${prefix[@]}" "$bench" w16 1000 "$w16_runs"
    done
    stop_busy
done

#!/usr/bin/env bash
# Bring up a single-node Slurm cluster on this Debian host, as root, idempotently.
#
# Installs munge, slurmctld, slurmd, slurm-client and libpmix-dev when missing
# (apt-get), creates the munge key, writes slurm.conf for this host, starts
# munged, slurmctld and slurmd by hand (no systemd, no cgroups:
# proctrack/linuxproc, task/none) and waits until `sinfo` shows the node idle,
# resuming it if it came up down or drained. Running it again with the same
# settings leaves running daemons alone.
#
# Usage:  sudo jobs/slurm/local-cluster.sh          # start (or check) the cluster
#         sudo jobs/slurm/local-cluster.sh stop     # stop the daemons it started
#
# Variables (environment):
#   SLURM_OVERSUBSCRIBE  CPUs advertised per core of `nproc` (default 4): more
#                        CPUs than cores lets sweeps and their report job queue
#                        together on a small machine (CPUs = nproc * this)
#   SLURM_CPUS           CPUs of the node, overriding the product above
#   SLURM_PARTITION      partition name (default debug)
#   SLURM_CLUSTER        cluster name (default syncbench)
#   SLURM_CONF_DIR       where slurm.conf goes (default /etc/slurm)
#   SLURM_WAIT           seconds to wait for the node to be idle (default 90)
#   SLURM_NO_INSTALL     set to 1 to never call apt-get
#   SLURM_CTLD_ADDR      address slurmctld is reached at (default 127.0.0.1; the emulated
#                        cluster's nodes, in their own network namespaces, need the bridge's)
#   SLURM_EXTRA_CONF     a file appended to slurm.conf (the emulated cluster's nodes and
#                        partition, written by 'syncbench cluster up --slurm')
set -euo pipefail

ACTION=${1:-start}
CONF_DIR=${SLURM_CONF_DIR:-/etc/slurm}
CONF=$CONF_DIR/slurm.conf
PARTITION=${SLURM_PARTITION:-debug}
CLUSTER=${SLURM_CLUSTER:-syncbench}
WAIT=${SLURM_WAIT:-90}
NODE=$(hostname -s)
# nproc obeys OMP_NUM_THREADS (set to 1 for the ranks): ask it without.
CORES=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
CPUS=${SLURM_CPUS:-$(( CORES * ${SLURM_OVERSUBSCRIBE:-4} ))}
LOG_DIR=/var/log/slurm
CTLD_PID=/run/slurmctld.pid
CTLD_ADDR=${SLURM_CTLD_ADDR:-127.0.0.1}
# One pid file, spool and log per node name: the emulated nodes run slurmd's of their own.
SLURMD_PID=/run/slurmd-$NODE.pid
MUNGE_PID=/run/munge/munged.pid
export SLURM_CONF=$CONF

say() { echo "local-cluster: $*"; }
die() { echo "local-cluster: error: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (it installs packages and starts daemons)"

# A daemon is running when its pid file names a live process.
running() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop_pidfile() {
    if running "$1"; then
        local pid; pid=$(cat "$1")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        say "stopped $2 (pid $pid)"
    fi
    rm -f "$1"
}

if [ "$ACTION" = stop ]; then
    stop_pidfile "$SLURMD_PID" slurmd
    stop_pidfile /run/slurmd.pid slurmd  # written before pid files were per node
    stop_pidfile "$CTLD_PID" slurmctld
    exit 0
fi
[ "$ACTION" = start ] || die "unknown action '$ACTION' (start or stop)"

install_packages() {
    local missing=() pkg
    for pkg in munge slurmctld slurmd slurm-client libpmix-dev; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" \
            || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "${SLURM_NO_INSTALL:-0}" = 1 ] && die "missing packages: ${missing[*]}"
    say "installing ${missing[*]}"
    apt-get update -qq
    # Package scripts must not try to start services (there is no init system here).
    DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
}

start_munge() {
    install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
    install -d -o munge -g munge -m 0755 /run/munge
    if [ ! -s /etc/munge/munge.key ]; then
        say "creating the munge key"
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
    if ! running "$MUNGE_PID"; then
        rm -f /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock
        runuser -u munge -- /usr/sbin/munged --pid-file="$MUNGE_PID"
        say "started munged"
    fi
    munge -n | unmunge >/dev/null || die "munge does not work (see /var/log/munge/munged.log)"
}

write_conf() {
    local new
    new=$(mktemp)
    cat >"$new" <<EOF
# Written by syncbench jobs/slurm/local-cluster.sh: one node, no cgroups, no accounting.
ClusterName=$CLUSTER
SlurmctldHost=$NODE($CTLD_ADDR)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# a requeued job waits out its credential's lifetime before it starts again (120 s by
# default, slurm.conf(5)): 10 s keeps jobs/slurm/train-requeue.sbatch's test short
AuthInfo=cred_expire=10
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=/run/slurmd-%n.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd-%n.log
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmctldTimeout=60
SlurmdTimeout=120
InactiveLimit=0
KillWait=5
MinJobAge=300
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
    if [ -n "${SLURM_EXTRA_CONF:-}" ]; then
        [ -f "$SLURM_EXTRA_CONF" ] || die "SLURM_EXTRA_CONF=$SLURM_EXTRA_CONF is not a file"
        cat "$SLURM_EXTRA_CONF" >>"$new"
    fi
    install -d "$CONF_DIR" "$LOG_DIR" /var/spool/slurmctld /var/spool/slurmd "/var/spool/slurmd/$NODE"
    if [ -f "$CONF" ] && cmp -s "$new" "$CONF"; then
        rm -f "$new"
        return 1  # unchanged
    fi
    install -m 0644 "$new" "$CONF"
    rm -f "$new"
    say "wrote $CONF (node $NODE, $CPUS CPUs, partition $PARTITION)"
    return 0
}

start_slurm() {
    local changed=$1
    if [ "$changed" = 1 ]; then
        # A new configuration: restart what runs with the old one.
        stop_pidfile "$SLURMD_PID" slurmd
        stop_pidfile /run/slurmd.pid slurmd  # written before pid files were per node
        stop_pidfile "$CTLD_PID" slurmctld
    fi
    if ! running "$CTLD_PID"; then
        /usr/sbin/slurmctld -f "$CONF"
        say "started slurmctld"
    fi
    if ! running "$SLURMD_PID"; then
        /usr/sbin/slurmd -f "$CONF" -N "$NODE"
        say "started slurmd"
    fi
}

wait_idle() {
    local state="" deadline=$(( SECONDS + WAIT ))
    while (( SECONDS < deadline )); do
        state=$(sinfo -h -n "$NODE" -o %t 2>/dev/null | head -n1 || true)
        case "$state" in
            idle|mix|alloc|comp)
                say "node $NODE is $state"; sinfo; return 0 ;;
            down*|drain*|drng*|fail*|inval*)
                scontrol update nodename="$NODE" state=resume 2>/dev/null \
                    || scontrol update nodename="$NODE" state=idle 2>/dev/null || true ;;
        esac
        sleep 1
    done
    echo "local-cluster: node $NODE not idle after ${WAIT}s (state '${state:-no answer}')" >&2
    tail -n 20 "$LOG_DIR/slurmctld.log" "$LOG_DIR/slurmd-$NODE.log" >&2 || true
    exit 1
}

install_packages
start_munge
changed=0
write_conf && changed=1
start_slurm "$changed"
wait_idle

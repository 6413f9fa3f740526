#!/usr/bin/env bash
# Bring up a single-node Slurm cluster on this Debian host, as root, idempotently, in a
# folder of its own: it never writes /etc/slurm or /etc/munge and never stops a daemon
# it did not start, so it can run beside a site's Slurm and munge.
#
# Installs munge, slurmctld, slurmd, slurm-client and libpmix-dev when missing
# (apt-get), then, all under $SYNCBENCH_SLURM_DIR (default /run/syncbench-slurm):
#   slurm.conf             this cluster's configuration (first line: the header below)
#   munge/                 its own munged: socket, pid file; munge/private/ key, seed, log
#   run/                   pid files, and NAME.started: "PID START" of each daemon it
#                          started (START: the process's start time, /proc/PID/stat)
#   state/, spool/NODE/    slurmctld's state, each slurmd's spool
#   log/                   slurmctld.log, slurmd-NODE.log
# It starts munged, slurmctld and slurmd by hand (no systemd, no cgroups:
# proctrack/linuxproc, task/none) on ports of their own (6917, 6918: not Slurm's 6817,
# 6818) and waits until `sinfo` shows the node idle, resuming it if it came up down or
# drained. Running it again with the same settings leaves running daemons alone; with
# other settings it restarts the daemons it started.
#
# It refuses (one line, exit status 1) a slurm.conf in its folder whose first line is not
# its own header: a folder of a site's Slurm stays as it is. It stops a daemon only
# through its own run/NAME.started record, and only while that pid is still the process
# it started (same name, same start time).
#
# Slurm's commands find this cluster through SLURM_CONF (the script prints it):
#   export SLURM_CONF=/run/syncbench-slurm/slurm.conf     # then sinfo, sbatch, squeue ...
# (`make test-slurm` and `make test-cluster` set it.) Without it they read the host's
# /etc/slurm/slurm.conf: the site's cluster, or none.
#
# Usage:  sudo jobs/slurm/local-cluster.sh          # start (or check) the cluster
#         sudo jobs/slurm/local-cluster.sh stop     # stop the daemons it started
#         jobs/slurm/local-cluster.sh conf          # print the SLURM_CONF path
#
# Variables (environment):
#   SYNCBENCH_SLURM_DIR  the cluster's folder (default /run/syncbench-slurm; a tmpfs, so a
#                        reboot, which ends the daemons, also forgets their state)
#   SLURM_OVERSUBSCRIBE  CPUs advertised per core of `nproc` (default 4): more
#                        CPUs than cores lets sweeps and their report job queue
#                        together on a small machine (CPUs = nproc * this)
#   SLURM_CPUS           CPUs of the node, overriding the product above
#   SLURM_PARTITION      partition name (default debug)
#   SLURM_CLUSTER        cluster name (default syncbench)
#   SLURM_CTLD_PORT      slurmctld's port (default 6917)
#   SLURM_NODE_PORT      slurmd's port (default 6918)
#   SLURM_WAIT           seconds to wait for the node to be idle (default 90)
#   SLURM_NO_INSTALL     set to 1 to never call apt-get
#   SLURM_CTLD_ADDR      address slurmctld is reached at (default 127.0.0.1; the emulated
#                        cluster's nodes, in their own network namespaces, need the bridge's)
#   SLURM_EXTRA_CONF     a file appended to slurm.conf (the emulated cluster's nodes and
#                        partition, written by 'syncbench cluster up --slurm')
set -euo pipefail

ACTION=${1:-start}
DIR=${SYNCBENCH_SLURM_DIR:-/run/syncbench-slurm}
CONF=$DIR/slurm.conf
HEADER="# Written by syncbench jobs/slurm/local-cluster.sh: one node, no cgroups, no accounting."
PARTITION=${SLURM_PARTITION:-debug}
CLUSTER=${SLURM_CLUSTER:-syncbench}
CTLD_PORT=${SLURM_CTLD_PORT:-6917}
NODE_PORT=${SLURM_NODE_PORT:-6918}
WAIT=${SLURM_WAIT:-90}
NODE=$(hostname -s)
# nproc obeys OMP_NUM_THREADS (set to 1 for the ranks): ask it without.
CORES=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
CPUS=${SLURM_CPUS:-$(( CORES * ${SLURM_OVERSUBSCRIBE:-4} ))}
RUN=$DIR/run
LOG_DIR=$DIR/log
MUNGE=$DIR/munge
MUNGE_SOCKET=$MUNGE/munge.socket
CTLD_ADDR=${SLURM_CTLD_ADDR:-127.0.0.1}
export SLURM_CONF=$CONF

say() { echo "local-cluster: $*"; }
die() { echo "local-cluster: error: $*" >&2; exit 1; }

if [ "$ACTION" = conf ]; then echo "$CONF"; exit 0; fi
[ -z "${SLURM_CONF_DIR:-}" ] \
    || die "SLURM_CONF_DIR is no longer read: SYNCBENCH_SLURM_DIR names the cluster's folder"
[ "$(id -u)" = 0 ] || die "run as root (it installs packages and starts daemons)"
case "$DIR" in /*) ;; *) die "SYNCBENCH_SLURM_DIR must be an absolute path, got '$DIR'" ;; esac
[ "$ACTION" = stop ] && [ ! -d "$RUN" ] && exit 0  # nothing was started here

# A slurm.conf there that this script did not write is left as it is.
if [ -e "$CONF" ] && [ "$(head -n 1 "$CONF" 2>/dev/null)" != "$HEADER" ]; then
    die "$CONF was not written by local-cluster.sh (its first line is not the script's" \
        "header): left as it is; set SYNCBENCH_SLURM_DIR to a folder of its own"
fi

install -d -m 0755 "$DIR" "$RUN" "$LOG_DIR"
# One start or stop at a time (flock: released when the holder exits, however it ends;
# the daemons it starts do not inherit it).
exec 9>"$RUN/lock"
flock -w 300 9 || die "another local-cluster.sh holds $RUN/lock"

# Start time of a live process (field 22 of /proc/PID/stat, after the command's ")");
# nothing for an ended one (a zombie nobody reaped).
start_time() {
    local stat rest fields
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    rest=${stat##*) }
    read -r -a fields <<<"$rest"
    case "${fields[0]}" in Z|X) return 1 ;; esac
    echo "${fields[19]}"
}

# The pid recorded in run/NAME.started while it is still the process started then: the
# same command name (COMM, e.g. slurmctld) and the same start time; else nothing.
ours() {
    local record=$RUN/$1.started comm=$2 pid start now
    [ -s "$record" ] || return 1
    read -r pid start <"$record" || return 1
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$comm" ] || return 1
    now=$(start_time "$pid") || return 1
    [ "$now" = "$start" ] || return 1
    echo "$pid"
}

# After starting a daemon that writes PIDFILE: record "PID START" as run/NAME.started.
record_started() {
    local name=$1 comm=$2 pidfile=$3 pid="" start
    for _ in $(seq 100); do
        if [ -s "$pidfile" ]; then
            pid=$(cat "$pidfile")
            [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$comm" ] && break
        fi
        pid=""
        sleep 0.1
    done
    [ -n "$pid" ] || die "$comm did not start (no live pid in $pidfile; see $LOG_DIR)"
    start=$(start_time "$pid") || die "$comm (pid $pid) ended at once (see $LOG_DIR)"
    echo "$pid $start" >"$RUN/$name.started"
}

# Stop the daemon recorded as NAME if it is still ours; forget the record either way.
stop_ours() {
    local name=$1 comm=$2 pid
    if pid=$(ours "$name" "$comm"); then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 100); do ours "$name" "$comm" >/dev/null || break; sleep 0.1; done
        if ours "$name" "$comm" >/dev/null; then
            kill -KILL "$pid" 2>/dev/null || true
            say "killed $comm (pid $pid: still running 10 s after SIGTERM)"
        else
            say "stopped $comm (pid $pid)"
        fi
    fi
    rm -f "$RUN/$name.started"
}

if [ "$ACTION" = stop ]; then
    stop_ours "slurmd-$NODE" slurmd
    stop_ours slurmctld slurmctld
    stop_ours munged munged
    exit 0
fi
[ "$ACTION" = start ] || die "unknown action '$ACTION' (start, stop or conf)"

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

# A munged of this cluster's own, with its own key: the host's munged, key and socket
# (/etc/munge, /run/munge) are never touched.
start_munge() {
    install -d -m 0755 "$MUNGE"
    install -d -m 0700 "$MUNGE/private"
    if [ ! -s "$MUNGE/private/munge.key" ]; then
        (umask 077; dd if=/dev/urandom of="$MUNGE/private/munge.key" bs=1024 count=1 \
            status=none)
        chmod 0400 "$MUNGE/private/munge.key"
        say "created $MUNGE/private/munge.key"
    fi
    if ! ours munged munged >/dev/null; then
        rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock" "$MUNGE/munged.pid"
        /usr/sbin/munged --socket="$MUNGE_SOCKET" --key-file="$MUNGE/private/munge.key" \
            --pid-file="$MUNGE/munged.pid" --log-file="$MUNGE/private/munged.log" \
            --seed-file="$MUNGE/private/munged.seed" 9>&- \
            || die "munged did not start (see $MUNGE/private/munged.log)"
        record_started munged munged "$MUNGE/munged.pid"
        say "started munged"
    fi
    munge -n -S "$MUNGE_SOCKET" | unmunge -S "$MUNGE_SOCKET" >/dev/null \
        || die "munge does not work (see $MUNGE/private/munged.log)"
}

write_conf() {
    local new
    new=$(mktemp "$DIR/.slurm.conf.XXXXXX")
    cat >"$new" <<EOF
$HEADER
# Its folder: $DIR (SLURM_CONF=$CONF). Nothing of the host's Slurm or munge is used.
ClusterName=$CLUSTER
SlurmctldHost=$NODE($CTLD_ADDR)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$NODE_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# a requeued job waits out its credential's lifetime before it starts again (120 s by
# default, slurm.conf(5)): 10 s keeps jobs/slurm/train-requeue.sbatch's test short
AuthInfo=cred_expire=10,socket=$MUNGE_SOCKET
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
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd-%n.log
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldTimeout=60
SlurmdTimeout=120
InactiveLimit=0
KillWait=5
MinJobAge=300
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
    if [ -n "${SLURM_EXTRA_CONF:-}" ]; then
        [ -f "$SLURM_EXTRA_CONF" ] || { rm -f "$new"; die "SLURM_EXTRA_CONF=$SLURM_EXTRA_CONF is not a file"; }
        cat "$SLURM_EXTRA_CONF" >>"$new"
    fi
    install -d -m 0755 "$DIR/state" "$DIR/spool" "$DIR/spool/$NODE"
    if [ -f "$CONF" ] && cmp -s "$new" "$CONF"; then
        rm -f "$new"
        return 1  # unchanged
    fi
    chmod 0644 "$new"
    mv -f "$new" "$CONF"
    say "wrote $CONF (node $NODE, $CPUS CPUs, partition $PARTITION)"
    return 0
}

start_slurm() {
    local changed=$1
    if [ "$changed" = 1 ]; then
        # A new configuration: restart the daemons this script started with the old one.
        stop_ours "slurmd-$NODE" slurmd
        stop_ours slurmctld slurmctld
    fi
    if ! ours slurmctld slurmctld >/dev/null; then
        rm -f "$RUN/slurmctld.pid"
        /usr/sbin/slurmctld -f "$CONF" 9>&- || die "slurmctld did not start (see $LOG_DIR/slurmctld.log)"
        record_started slurmctld slurmctld "$RUN/slurmctld.pid"
        say "started slurmctld"
    fi
    if ! ours "slurmd-$NODE" slurmd >/dev/null; then
        rm -f "$RUN/slurmd-$NODE.pid"
        /usr/sbin/slurmd -f "$CONF" -N "$NODE" 9>&- \
            || die "slurmd did not start (see $LOG_DIR/slurmd-$NODE.log)"
        record_started "slurmd-$NODE" slurmd "$RUN/slurmd-$NODE.pid"
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
say "Slurm's commands reach this cluster with: export SLURM_CONF=$CONF"

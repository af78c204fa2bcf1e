#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, for the `slurm` test set (make test-slurm) and for trying
# hydra/launcher=slurm by hand. Debian's packages, daemons started by hand (no systemd), each stopped by its PID.
#
#   scripts/slurm_cluster.sh start    install the packages if missing, write the configs, start munged, mariadbd,
#                                     slurmdbd, slurmctld, slurmd; wait until the node is idle (idempotent)
#   scripts/slurm_cluster.sh stop     stop every daemon it started, by the PID in its pid file
#   scripts/slurm_cluster.sh status   which daemons run, and the node's state
#   scripts/slurm_cluster.sh install  only install the packages (exit 3 where apt-get cannot)
#
# Accounting (slurmdbd on MariaDB) is part of it: submitit learns that a job died without a result only
# through sacct. Timings are short so the fault tests fit in minutes: a node whose slurmd is silent for
# SLURMD_TIMEOUT_S is down, finished jobs leave the controller after MIN_JOB_AGE_S, a cancelled job gets
# KILL_WAIT_S between SIGTERM and SIGKILL. Needs root.
set -euo pipefail

STATE=${JENSENKV_SLURM_STATE:-/var/lib/jensenkv-slurm}   # pid files, logs, spool, the controller's state
CLUSTER=jensenkv
PARTITION=${JENSENKV_SLURM_TEST_PARTITION:-debug}
SLURMD_TIMEOUT_S=${SLURMD_TIMEOUT_S:-20}
MIN_JOB_AGE_S=${MIN_JOB_AGE_S:-30}
KILL_WAIT_S=${KILL_WAIT_S:-10}
READY_TIMEOUT_S=${READY_TIMEOUT_S:-180}
PACKAGES=(slurm-wlm slurm-client slurmdbd munge mariadb-server)
DAEMONS=(munged mariadbd slurmdbd slurmctld slurmd)   # start order; stop runs it backwards
DB_SOCKET=/run/mysqld/mysqld.sock
DB_PASSWORD=jensenkv-slurm   # a local test database, reachable only through its socket and localhost

log() { echo "slurm_cluster: $*" >&2; }
pid_file() { echo "$STATE/run/$1.pid"; }
running() { local f; f=$(pid_file "$1"); [[ -s $f ]] && kill -0 "$(cat "$f")" 2>/dev/null; }

install_packages() {
  local missing=()
  for p in "${PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  log "apt-get install ${missing[*]}"
  if ! { apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 ||
         { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "${missing[@]}" >/dev/null 2>&1; }; }; then
    log "apt-get cannot install ${missing[*]} here"
    return 3
  fi
}

write_configs() {
  mkdir -p "$STATE"/{run,log,ctld,spool} /etc/slurm /run/mysqld
  chown mysql:mysql /run/mysqld
  # the node as slurmd sees it (CPUs, sockets, memory), minus the uptime line
  local node; node=$(slurmd -C | head -1)
  local host; host=$(hostname -s)
  cat > /etc/slurm/slurm.conf <<EOF
# written by scripts/slurm_cluster.sh: a single-node test cluster with short timings
ClusterName=$CLUSTER
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
ReturnToService=2
SlurmctldPidFile=$(pid_file slurmctld)
SlurmdPidFile=$(pid_file slurmd)
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1024
SlurmdTimeout=$SLURMD_TIMEOUT_S
SlurmctldTimeout=30
MinJobAge=$MIN_JOB_AGE_S
KillWait=$KILL_WAIT_S
InactiveLimit=0
Waittime=0
MessageTimeout=10
JobRequeue=1
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
$node
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  cat > /etc/slurm/slurmdbd.conf <<EOF
# written by scripts/slurm_cluster.sh
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
PidFile=$(pid_file slurmdbd)
LogFile=$STATE/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=$DB_PASSWORD
StorageLoc=slurm_acct_db
EOF
  chmod 600 /etc/slurm/slurmdbd.conf
}

wait_for() {  # wait_for SECONDS WHAT COMMAND...: poll until COMMAND succeeds
  local limit=$1 what=$2; shift 2
  local start=$SECONDS
  until "$@" >/dev/null 2>&1; do
    if (( SECONDS - start > limit )); then log "$what not ready after ${limit} s"; return 1; fi
    sleep 1
  done
}

start_daemon() {  # start_daemon NAME COMMAND...: start it unless its pid file names a live process
  local name=$1; shift
  if running "$name"; then return 0; fi
  log "starting $name"
  "$@" >> "$STATE/log/$name.out" 2>&1 &
  local pid=$!
  # daemons that fork write their own pid file; the others (run in the foreground) get this one
  case $name in munged|mariadbd|slurmdbd|slurmctld|slurmd) echo "$pid" > "$(pid_file "$name")" ;; esac
}

start() {
  local t0=$SECONDS
  install_packages
  write_configs
  mkdir -p /run/munge && chown munge:munge /run/munge
  start_daemon munged setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged --foreground
  wait_for 20 munged munge -n
  start_daemon mariadbd /usr/sbin/mariadbd --user=mysql --socket=$DB_SOCKET --skip-networking=0 \
    --bind-address=127.0.0.1 --pid-file=/run/mysqld/jensenkv.pid
  wait_for 60 mariadbd mariadb --socket=$DB_SOCKET -e "SELECT 1"
  mariadb --socket=$DB_SOCKET -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASSWORD';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
  start_daemon slurmdbd /usr/sbin/slurmdbd -D
  wait_for 60 slurmdbd sacctmgr -n list cluster
  sacctmgr -i -Q add cluster $CLUSTER >/dev/null 2>&1 || true   # already there on a second start
  start_daemon slurmctld /usr/sbin/slurmctld -D -i
  wait_for 60 slurmctld scontrol ping
  start_daemon slurmd /usr/sbin/slurmd -D
  if ! wait_for "$READY_TIMEOUT_S" "the node" node_idle; then status; return 1; fi
  log "ready in $((SECONDS - t0)) s: partition $PARTITION, node $(hostname -s) idle"
}

node_idle() {
  local state; state=$(sinfo -h -N -o '%t' 2>/dev/null | head -1)
  case $state in
    idle|mix|alloc) return 0 ;;
    down*|drain*) scontrol update nodename="$(hostname -s)" state=resume >/dev/null 2>&1; return 1 ;;
    *) return 1 ;;
  esac
}

stop() {
  local i
  for (( i=${#DAEMONS[@]}-1; i>=0; i-- )); do
    local name=${DAEMONS[$i]} f pid
    f=$(pid_file "$name")
    if running "$name"; then
      pid=$(cat "$f")   # read once: a daemon removes its own pid file as it exits
      log "stopping $name (pid $pid)"
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    fi
    rm -f "$f"
  done
}

status() {
  for name in "${DAEMONS[@]}"; do
    if running "$name"; then echo "$name: running (pid $(cat "$(pid_file "$name")"))"; else echo "$name: stopped"; fi
  done
  sinfo -N -o '%N %P %t %c %m %G' 2>/dev/null || true
}

case ${1:-} in
  start) start ;;
  stop) stop ;;
  status) status ;;
  install) install_packages ;;
  *) echo "usage: $0 start|stop|status|install" >&2; exit 2 ;;
esac

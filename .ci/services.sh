#!/usr/bin/env bash
# Start or stop the real services the integration tests use: a throwaway PostgreSQL cluster and a
# single-node SLURM (slurmctld + slurmd + munge), all state under $BASE. Prints the env to export.
#   .ci/services.sh start   -> prints ATTNRES_TEST_PG_URL=... ATTNRES_TEST_SLURM=1 SLURM_CONF=...
#   .ci/services.sh stop
set -euo pipefail
BASE=${ATTNRES_SERVICES_DIR:-/tmp/attnres-services}
PGPORT=${ATTNRES_PG_PORT:-55432}

install() {
  local need=()
  command -v slurmctld >/dev/null || need+=(slurmctld slurmd slurm-client munge)
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
  if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
  fi
}

start_pg() {
  local bin; bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
  mkdir -p "$BASE/pg" && chown postgres:postgres "$BASE/pg"
  if [ ! -f "$BASE/pg/data/PG_VERSION" ]; then
    runuser -u postgres -- "$bin/initdb" -D "$BASE/pg/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >&2
  fi
  runuser -u postgres -- "$bin/pg_ctl" -D "$BASE/pg/data" -l "$BASE/pg/log" \
    -o "-c listen_addresses=127.0.0.1 -p $PGPORT -k $BASE/pg" -w start </dev/null >&2
  runuser -u postgres -- "$bin/createdb" -h 127.0.0.1 -p "$PGPORT" -U postgres attnres_test 2>/dev/null || true
}

start_slurm() {
  mkdir -p "$BASE/slurm"/{run,log,spool/ctld,spool/d}
  local mem; mem=$(( $(awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo) - 1024 ))
  cat > "$BASE/slurm/slurm.conf" <<CONF
ClusterName=attnres
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmctldPidFile=$BASE/slurm/run/slurmctld.pid
SlurmdPidFile=$BASE/slurm/run/slurmd.pid
StateSaveLocation=$BASE/slurm/spool/ctld
SlurmdSpoolDir=$BASE/slurm/spool/d
SlurmctldLogFile=$BASE/slurm/log/slurmctld.log
SlurmdLogFile=$BASE/slurm/log/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
MinJobAge=3600
KillWait=10
NodeName=localhost NodeHostname=$(hostname -s) NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
  mkdir -p /run/munge && chown munge:munge /run/munge && chmod 0755 /run/munge
  # daemons must not hold this script's stdout: the caller reads it through $(...)
  pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged </dev/null >/dev/null 2>&1
  for _ in $(seq 100); do [ -S /run/munge/munge.socket.2 ] && break; sleep 0.1; done
  export SLURM_CONF=$BASE/slurm/slurm.conf
  /usr/sbin/slurmctld -f "$SLURM_CONF" </dev/null >/dev/null 2>&1
  /usr/sbin/slurmd -f "$SLURM_CONF" -N localhost </dev/null >/dev/null 2>&1
  for _ in $(seq 50); do sinfo -h -o %t 2>/dev/null | grep -q idle && break; sleep 0.2; done
  sinfo -h -o %t | grep -q idle || { echo "slurm did not come up" >&2; exit 1; }
}

stop() {
  local bin; bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  if [ -f "$BASE/pg/data/postmaster.pid" ]; then
    runuser -u postgres -- "$bin/pg_ctl" -D "$BASE/pg/data" -m fast -w stop >&2 || true
  fi
  for p in slurmd slurmctld; do
    [ -f "$BASE/slurm/run/$p.pid" ] && kill "$(cat "$BASE/slurm/run/$p.pid")" 2>/dev/null || true
  done
  if [ -f /run/munge/munged.pid ]; then  # and wait for it to go: a start right after must not find it exiting
    local mp; mp=$(cat /run/munge/munged.pid)
    kill "$mp" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$mp" 2>/dev/null || break; sleep 0.1; done
  fi
  pkill -f "$BASE/slurm/slurm.conf" 2>/dev/null || true  # daemons whose pid files are gone
  rm -rf "$BASE"
}

case "${1:-}" in
  start)
    install; stop 2>/dev/null || true
    start_pg; start_slurm
    echo "export ATTNRES_TEST_PG_URL=postgresql+psycopg://postgres@127.0.0.1:$PGPORT/attnres_test"
    echo "export ATTNRES_TEST_SLURM=1 SLURM_CONF=$BASE/slurm/slurm.conf"
    ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac

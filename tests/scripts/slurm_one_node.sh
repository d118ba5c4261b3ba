# Sourced by the Slurm checks: a real one-node Slurm cluster in a scratch directory (munge,
# slurmctld, slurmd as root; the node's CPUs declared as 8 so that 5 tasks fit on 2 cores).
# Usage: start_slurm DIR (exports SLURM_CONF; returns 77 when Slurm, munge or root is missing),
# stop_slurm DIR.
start_slurm() {
  local dir="$1" host
  command -v slurmctld > /dev/null && command -v slurmd > /dev/null && command -v munged > /dev/null || return 77
  [ "$(id -u)" = 0 ] || return 77
  host=$(hostname)
  mkdir -p "$dir/state" "$dir/spool" /run/munge
  chown munge:munge /run/munge
  if ! pgrep -x munged > /dev/null; then
    runuser -u munge -- /usr/sbin/munged
    touch "$dir/munged.started"  # stop_slurm stops it again
  fi
  cat > "$dir/slurm.conf" <<CONF
ClusterName=loomcheck
SlurmctldHost=$host
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmdSpoolDir=$dir/spool
StateSaveLocation=$dir/state
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
NodeName=$host CPUs=8 RealMemory=4000 State=UNKNOWN
PartitionName=check Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
CONF
  export SLURM_CONF="$dir/slurm.conf"
  slurmctld -i > "$dir/slurmctld.out" 2>&1
  slurmd > "$dir/slurmd.out" 2>&1
  local i
  for i in $(seq 1 100); do
    sinfo -h -o %T 2>/dev/null | grep -q idle && return 0
    sleep 0.2
  done
  echo "Slurm did not come up:"; cat "$dir"/*.log "$dir"/*.out; return 1
}

stop_slurm() {
  local dir="$1" f
  for f in "$dir/slurmd.pid" "$dir/slurmctld.pid"; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null; done
  sleep 1  # they save their state on the way out
  if [ -f "$dir/munged.started" ] && [ -f /run/munge/munged.pid ]; then kill "$(cat /run/munge/munged.pid)" 2>/dev/null; fi
  return 0
}

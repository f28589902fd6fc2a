# Sourced by the batched GPU scripts (gpu_system.sh, gpu_recheck.sh).
# st NAME LIMIT CMD...: runs CMD under `timeout LIMIT`, its output in $OUT/NAME.log, and a line
# "NAME rc=<exit> wall=<s>s" in $OUT/rcs.txt (rc 124: cut by the limit; SIGKILL 15 s later if the
# stage ignores SIGTERM: one 2-GPU call ran past the device limit and returned nothing).
st() { local name=$1 lim=$2; shift 2; local t=$(date +%s)
  timeout -k 15 "$lim" "$@" > "$OUT/$name.log" 2>&1; echo "$name rc=$? wall=$(( $(date +%s) - t ))s" >> "$OUT/rcs.txt"; }
export -f st

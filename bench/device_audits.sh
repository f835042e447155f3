#!/usr/bin/env bash
# One device call of several `pike audit` runs side by side on a machine of several GPUs,
# each run on GPUs of its own, resumable across calls as bench/device_calls.sh is for
# `pike bench`: each run dir travels between calls as a tarball.
#
#   LIMIT=580 [SRC=path/to/src] [CARRY=.tasks] [LOG=audit-call.log] [DRAIN=s] \
#     bash bench/device_audits.sh first|resume SPEC [SPEC ...]
#
# SPEC is NAME=DEVICES@SET@TASKS_DIR@IDS[@device]: `pike audit SET TASKS_DIR --tasks IDS
# --devices DEVICES --out .runs/NAME` (with `--construct-on device` where the fifth field
# says so); resume goes on with `pike audit --resume .runs/NAME --devices DEVICES`,
# unpacking CARRY/NAME.tgz first on a fresh machine. Several SPECs may share a NAME's
# GPUs only if they are run one after another: SPECs joined by `+` (A+B) run in order,
# apart ones at once. Each audit gets SIGINT (as Ctrl-C) 25 s before LIMIT seconds from
# the start; what a task had measured when cut is measured again after the resume, so
# a task longer than a call never finishes (give it a GPU of its own). DRAIN=s: each
# audit gets `--stop-after` s seconds before that SIGINT, so no task starts then and the
# ones in flight finish and are kept instead of being measured again. Every run dir
# comes back as $OUT/NAME.tgz, with the log ($OUT/LOG) holding each audit's output.
# ARGS="..." is added to every audit's command line (e.g. ARGS="--redo 14" with resume:
# a task whose recorded verdict is kept otherwise is judged again).
set -u
T0=$(date +%s)
mode=${1:?first or resume}; shift
LIMIT=${LIMIT:-580}; CARRY=${CARRY:-.tasks}; OUT=${OUT:?the folder that comes back}
. "$(dirname "$0")/device_env.sh"
log=$OUT/${LOG:-audit-call.log}
deadline=$(( T0 + LIMIT - 25 ))

one_audit() {  # NAME=DEVICES@SET@TASKS_DIR@IDS[@device]
  local name=${1%%=*} rest=${1#*=} devices set tasks ids on left rc stop
  IFS=@ read -r devices set tasks ids on <<<"$rest"
  left=$(( deadline - $(date +%s) ))
  if [ "$left" -le 5 ]; then echo "$(date -u +%T) driver: $name not started, no time left"; return; fi
  stop=${DRAIN:+--stop-after $(( left > DRAIN ? left - DRAIN : 1 ))}
  echo "$(date -u +%T) driver: $mode $name on $devices, ${left}s left ${stop}, src $SRC"
  if [ "$mode" = resume ] && [ ! -d ".runs/$name" ] && [ -f "$CARRY/$name.tgz" ]; then
    tar xzf "$CARRY/$name.tgz" -C .runs
  fi
  if [ "$mode" = resume ] && [ ! -d ".runs/$name" ]; then  # not a fresh audit unasked
    echo "$(date -u +%T) driver: $name: nothing to resume (no .runs/$name, no $CARRY/$name.tgz carried)"
    return
  fi
  if [ -d ".runs/$name" ]; then
    timeout -s INT "$left" python3 -m pike audit --resume ".runs/$name" --devices "$devices" \
      $stop ${ARGS:-} >"$OUT/$name.out" 2>&1
  else
    timeout -s INT "$left" python3 -m pike audit "$set" "$tasks" --tasks "$ids" \
      --devices "$devices" ${on:+--construct-on "$on"} --out ".runs/$name" $stop ${ARGS:-} \
      >"$OUT/$name.out" 2>&1
  fi
  rc=$?
  echo "$(date -u +%T) driver: $name rc $rc"
  [ -d ".runs/$name" ] && tar czf "$OUT/$name.tgz" -C .runs "$name"
}

in_order() {  # A+B+C: one after another on the same GPUs
  local spec
  IFS=+ read -r -a specs <<<"$1"
  for spec in "${specs[@]}"; do one_audit "$spec"; done
}

for group in "$@"; do in_order "$group" >>"$log" 2>&1 & done
wait
processes_left >>"$log" 2>&1
free -g >>"$log" 2>&1
tail -20 "$log"

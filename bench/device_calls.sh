#!/usr/bin/env bash
# One device call of a `pike bench` run that spans several calls of a lent GPU machine,
# each cut off at a fixed limit, with the run dir carried between them as a tarball.
# This is the driver behind the bench-level2-h200-* pages (until 2026-11-29 kept
# git-ignored as .tasks/fresh.sh); on a machine of your own, `pike bench --resume` alone
# does the same.
#
#   RUN=name LIMIT=592 TASKS_DIR=path CONFIG=file [TASKS=9,12,...] [JOBS=4] [WORKERS=4] \
#     [SRC=path/to/src] [CARRY=dir] [LOG=bench-call.log] [DRAIN=s] bash bench/device_calls.sh first|resume
#
# first: a fresh `pike bench TASKS_DIR --tasks TASKS` into .runs/RUN; resume: unpacks
# CARRY/RUN.tgz (default .tasks/) and goes on with `pike bench --resume`. Either way the
# bench gets SIGINT (as Ctrl-C) 25 s before LIMIT seconds from the start, so the
# tarball ($OUT/RUN.tgz) and the log ($OUT/LOG, with the driver's wall-clock lines) are
# written within the call; two runs at once on a machine of two GPUs (each under its own
# CUDA_VISIBLE_DEVICES and taskset) need two LOG names. It lists any pike, bwrap or
# compile-worker process left behind, and where the bench was killed (status 137: a
# level1 bench was, twice, with no word in its log) the kernel's out-of-memory lines and
# the host's memory. Where the machine lacks pike's small dependencies, wheels in .whl/
# are installed into /tmp/site (no network there); PIKE_BWRAP may name a bubblewrap
# binary (both in bench/device_env.sh; bench/device_setup.sh makes .whl/, .bwrap/ and
# .tasks/). DRAIN=s: `pike bench --stop-after` s seconds before that SIGINT, so nothing
# new starts then and what is in flight finishes and is kept (without it, the candidates
# in flight at the cut are lost and judged again after the resume).
set -u
T0=$(date +%s)
mode=${1:?first or resume}
RUN=${RUN:?}; LIMIT=${LIMIT:-592}; JOBS=${JOBS:-4}; WORKERS=${WORKERS:-4}
CARRY=${CARRY:-.tasks}; OUT=${OUT:?the folder that comes back}
. "$(dirname "$0")/device_env.sh"
log=$OUT/${LOG:-bench-call.log}
# a machine still warm from the last call keeps .runs/RUN (ignored in .gitignore, so it
# stays between calls as build outputs do; on 2026-12-01, ignored only in the local
# .git/info/exclude, it was removed); a fresh one unpacks the carried tarball
if [ "$mode" = resume ] && [ ! -d ".runs/$RUN" ]; then tar xzf "$CARRY/$RUN.tgz" -C .runs; fi
left=$(( LIMIT - ( $(date +%s) - T0 ) - 25 ))
stop=${DRAIN:+--stop-after $(( left - DRAIN ))}
echo "$(date -u +%T) driver: $mode $RUN, bench limit ${left}s ${stop}, src $SRC" | tee -a "$log"
start=$(date +%s)
if [ "$mode" = first ]; then
  timeout -s INT "$left" python3 -m pike bench "${TASKS_DIR:?}" ${TASKS:+--tasks "$TASKS"} \
    --jobs "$JOBS" --workers "$WORKERS" --device cuda ${CONFIG:+--config "$CONFIG"} \
    --out ".runs/$RUN" $stop >>"$log" 2>&1
else
  timeout -s INT "$left" python3 -m pike bench --resume ".runs/$RUN" --jobs "$JOBS" \
    --workers "$WORKERS" $stop >>"$log" 2>&1
fi
rc=$?
echo "$(date -u +%T) driver: bench rc $rc after $(( $(date +%s) - start ))s" | tee -a "$log"
if [ "$rc" = 137 ]; then  # SIGKILL: nothing in pike sends it to itself; the OOM killer?
  { echo "driver: killed; the kernel's last words on it and the host's memory:"
    dmesg 2>&1 | grep -iE "out of memory|killed process|oom" | tail -5
    free -g; } 2>&1 | tee -a "$log"
fi
processes_left 2>&1 | tee -a "$log"
tar czf "$OUT/$RUN.tgz" -C .runs "$RUN"
tail -5 "$log"

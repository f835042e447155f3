#!/usr/bin/env bash
# A `pike bench` run that outlives the device call starting it: on a lent machine kept warm
# by calls issued back to back, the bench runs on between them, so its wall time is one
# bench's, with no cut, drain and resume at every call (bench/device_calls.sh's way, which
# each call costs the bench's start and the lanes' drain). A command's processes are killed
# when it returns, except one in a session of its own (setsid), hence this driver.
#
#   RUN=name TASKS_DIR=path CONFIG=file [TASKS=9,12,...] [JOBS=4] [WORKERS=4] [SRC=path/to/src] \
#     [DEVICE=cuda] [STOP_AFTER=s] [LIMIT=590] bash bench/device_background.sh start|wait|stop
#
# start: copies SRC, TASKS_DIR and CONFIG under /tmp/pike-bg (outside the tree a later call
#        re-copies, so no child of the bench imports a file mid-copy), starts the bench there
#        in its own session, then waits as `wait` does.
# wait:  until the bench ends or LIMIT less 20 s from the call's start has passed.
# stop:  SIGINT (as Ctrl-C) to the bench, then waits for it to end.
# STOP_AFTER=s (start): `pike bench --stop-after s`, so a bench that would outrun the
# session's device time starts nothing new after s seconds and ends with what was in
# flight judged and kept; `stop` (SIGINT) loses what is in flight.
# A call that comes more than the machine's idle time (30 s) after the last one ended finds
# the machine given back and the bench gone with it (2026-12-04: a session's turn broke off
# between calls): then resume from the last RUN.tgz.
# Each mode ends by putting the bench's log and a tarball of its run dir (a copy of the run
# store made by sqlite's backup, so a live store is copied whole) into $OUT as RUN.log and
# RUN.tgz: if the machine goes back between calls, bench/device_calls.sh resume goes on
# from that tarball on a fresh one.
set -u
T0=$(date +%s)
mode=${1:?start, wait or stop}
RUN=${RUN:?}; LIMIT=${LIMIT:-590}; OUT=${OUT:?the folder that comes back}
base=/tmp/pike-bg; run=$base/runs/$RUN; log=$base/$RUN.log; pidfile=$base/$RUN.pid
if [ "$mode" = start ]; then
  rm -rf "$base" && mkdir -p "$base/runs"
  cp -r "${SRC:-$PWD/src}" "$base/src"
  cp -r "${TASKS_DIR:?}" "$base/tasks"
  [ -n "${CONFIG:-}" ] && cp "$CONFIG" "$base/config.yaml"
fi
SRC=$base/src
. "$(dirname "$0")/device_env.sh"
alive() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }
if [ "$mode" = start ]; then
  echo "$(date -u +%T) driver: start $RUN in the background, src $SRC" >>"$log"
  # an async command starts with SIGINT ignored, and Python keeps it so: `stop` needs it back
  setsid env --default-signal=INT python3 -m pike bench "$base/tasks" ${TASKS:+--tasks "$TASKS"} \
    --jobs "${JOBS:-4}" --workers "${WORKERS:-4}" --device "${DEVICE:-cuda}" \
    ${CONFIG:+--config "$base/config.yaml"} --out "$run" ${STOP_AFTER:+--stop-after "$STOP_AFTER"} >>"$log" 2>&1 < /dev/null &
  echo $! >"$pidfile"
elif [ "$mode" = stop ] && alive; then
  echo "$(date -u +%T) driver: SIGINT to the bench" >>"$log"
  kill -INT "$(cat "$pidfile")"
fi
while alive && [ $(( $(date +%s) - T0 )) -lt $(( LIMIT - 20 )) ]; do sleep 5; done
if alive; then
  echo "$(date -u +%T) driver: bench still running at the call's end" >>"$log"
else
  echo "$(date -u +%T) driver: bench ended" >>"$log"
  processes_left >>"$log" 2>&1
fi
snap=$(mktemp -d)
cp -r "$run" "$snap/$RUN" && rm -f "$snap/$RUN"/run.sqlite*
python3 - "$run/run.sqlite" "$snap/$RUN/run.sqlite" <<'EOF'
import sqlite3, sys
src, dst = (sqlite3.connect(p) for p in sys.argv[1:3])
src.backup(dst)
EOF
tar czf "$OUT/$RUN.tgz" -C "$snap" "$RUN" && rm -rf "$snap"
cp "$log" "$OUT/$RUN.log"
tail -4 "$log"

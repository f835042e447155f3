# Sourced by the device-call drivers (bench/device_calls.sh, bench/device_audits.sh): pike's
# environment on a lent GPU machine, which has torch but not pike's small dependencies and
# no network. Wheels in .whl/ (all of them, not a list: openai 3.x moved to httpx2, and a
# list went stale) go into /tmp/site once per machine; SRC (default ./src) is the pike
# that runs, so a call can run a `git archive` of a commit while the tree changes;
# .bwrap/bwrap, where carried, is the OS sandbox.
SRC=${SRC:-$PWD/src}
if [ -d .whl ] && [ ! -d /tmp/site/pydantic ]; then
  pip install -q --no-deps --no-index --target /tmp/site .whl/*.whl >/dev/null 2>&1
fi
export PYTHONPATH=$SRC:/tmp/site
[ -x .bwrap/bwrap ] && export PIKE_BWRAP=$PWD/.bwrap/bwrap
mkdir -p .runs

# what outlived a run: pike, bwrap or torch.compile workers still running
processes_left() {
  sleep 3; echo "driver: processes left:"
  ps -eo pid,ppid,etimes,pcpu,args | grep -E "[p]ike|[b]wrap|[c]ompile_worker" | cut -c1-220
}

#!/usr/bin/env bash
# Makes the git-ignored folders the device-call drivers carry to a lent GPU machine
# (bench/device_calls.sh, bench/device_audits.sh), from a fresh checkout on a machine
# that reaches the package registries:
#
#   bash bench/device_setup.sh [KERNELBENCH_DIR]   # default ../shared/kernelbench
#   LEVEL5=1 bash bench/device_setup.sh            # also diffusers, for level5's 6 and 8
#
# .whl/    pike's small dependencies as CPython 3.12 wheels (the lent machine has torch,
#          numpy and no network; bench/device_env.sh installs them into /tmp/site). The
#          report's matplotlib stack and numpy are left out: `pike bench` and `pike audit`
#          never import them, and with them the carried tree passed the device tool's
#          64 MiB (2026-12-03: bench/results alone was about 42 MB of it; 2026-12-05, its
#          larger run stores gzipped, the tracked files are 21 MB).
# .bwrap/  bubblewrap from the Debian package, for the OS sandbox (PIKE_BWRAP).
# .tasks/  copies of the KernelBench task folders (never committed) and bench120.yaml,
#          the 120 s offline budget of the level2 runs.
# Then a `git archive` of the commit to run goes into .tasks/snap/src, as the results
# pages' commands expect (device_calls.sh's SRC).
set -euo pipefail
cd "$(dirname "$0")/.."
kernelbench=${1:-../shared/kernelbench}

mkdir -p .whl .bwrap .tasks
pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux_2_28_x86_64 -d .whl \
  typer rich pydantic pyyaml psutil openai tenacity jinja2 ninja
rm -f .whl/numpy-*.whl  # openai and pydantic do not need it; the machine's torch has it
# level5's 6 and 8 import diffusers, which the lent machines lack (its own needs,
# huggingface-hub, pillow, regex and the rest, are there): 6.4 MB more to carry
if [ "${LEVEL5:-}" = 1 ]; then
  pip download -q --no-deps --only-binary=:all: -d .whl diffusers==0.42.1
fi

work=$(mktemp -d)
(cd "$work" && apt-get download bubblewrap >/dev/null 2>&1 && dpkg -x bubblewrap_*.deb x)
cp "$work/x/usr/bin/bwrap" .bwrap/bwrap
rm -rf "$work"

for level in level1 level2 level3-pike level5; do
  [ -d "$kernelbench/$level" ] && rm -rf ".tasks/$level" && cp -r "$kernelbench/$level" .tasks/
done
printf 'search: {offline: {max_seconds: 120}}\n' > .tasks/bench120.yaml
rm -rf .tasks/snap && mkdir -p .tasks/snap && git archive HEAD src | tar -x -C .tasks/snap

carried=$(du -sm .whl .bwrap .tasks | awk '{s += $1} END {print s}')
tracked=$(git ls-files -z | xargs -0 du -cm 2>/dev/null | tail -1 | cut -f1)
echo "carried folders ${carried} MB, tracked files ${tracked} MB (the device tool takes 64 MiB in all);"
echo "carry only the task folder a run needs if that is over"

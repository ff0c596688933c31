#!/bin/bash
# After every shard finished: combine $RESULTS/shard-* into $RESULTS/all (the same files one machine writes).
set -euo pipefail
COURSE=${COURSE:-${SLURM_SUBMIT_DIR:-$PWD}}
RESULTS=${RESULTS:?set RESULTS to the folder the shards wrote into}
cd "$COURSE"
exec "${PYTHON:-.venv/bin/python}" -m specdec.course.cohort merge "$RESULTS"/shard-* --out "$RESULTS/all"

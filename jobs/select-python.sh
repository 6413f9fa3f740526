# Sourced by jobs/slurm/common.sh and jobs/mpirun/common.sh: choose the Python that runs
# syncbench, the way HPC users prepare a job (load or activate an environment, then
# submit or launch). First that applies:
#   1. $SYNCBENCH_VENV/bin/python   (explicit choice; must exist)
#   2. $VIRTUAL_ENV/bin/python      (an activated venv), when it imports syncbench
#   3. python3 on PATH              (a loaded module, conda, ...), when it imports syncbench
#   4. $SYNCBENCH_ROOT/.venv/bin/python  (what `make venv` builds)
# Sets PY (the interpreter) and PY_FROM (which rule chose it, for the job's first line).
# Returns 1 after one line on stderr when nothing fits.
# shellcheck shell=bash

# True when the interpreter $1 can import the syncbench command line.
syncbench_imports() {
    [ -x "$1" ] && "$1" -c "import syncbench.bench.cli" >/dev/null 2>&1
}

select_python() {
    local tried="" candidate
    if [ -n "${SYNCBENCH_VENV:-}" ]; then
        PY=$SYNCBENCH_VENV/bin/python
        PY_FROM=SYNCBENCH_VENV
        if [ ! -x "$PY" ]; then
            echo "syncbench job: no Python at $PY (from SYNCBENCH_VENV): fix or unset it" >&2
            return 1
        fi
        return 0
    fi
    if [ -n "${VIRTUAL_ENV:-}" ]; then
        PY=$VIRTUAL_ENV/bin/python
        PY_FROM=VIRTUAL_ENV
        syncbench_imports "$PY" && return 0
        tried="VIRTUAL_ENV=$VIRTUAL_ENV, "
    fi
    candidate=$(command -v python3 || true)
    if [ -n "$candidate" ]; then
        PY=$candidate
        PY_FROM="python3 on PATH"
        syncbench_imports "$PY" && return 0
        tried="${tried}python3 on PATH ($candidate), "
    fi
    PY=$SYNCBENCH_ROOT/.venv/bin/python
    PY_FROM="the repository's .venv${tried:+; without syncbench: ${tried%, }}"
    [ -x "$PY" ] && return 0
    echo "syncbench job: no Python with syncbench (${tried}no $PY): activate a venv that" \
         "has it, set SYNCBENCH_VENV, or run 'make venv' in $SYNCBENCH_ROOT" >&2
    return 1
}

#!/usr/bin/env bash
# The servers of the sharded-grading tests, from Debian's packages, installed where this user
# may (root, or sudo without a password): PostgreSQL's server programs (test_postgres.py
# starts a throw-away server in a temporary folder) and Slurm with munge (test_slurm.py starts
# a one-node cluster), and stress-ng (test_under_load.py grades beside a bounded CPU load).
# Nothing is started here. Elsewhere those tests are skipped and say why.
set -euo pipefail
need=()
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || command -v initdb >/dev/null \
    || need+=(postgresql)
command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
    || need+=(slurm-wlm munge)
command -v stress-ng >/dev/null || need+=(stress-ng)
[[ ${#need[@]} -eq 0 ]] && exit 0
if ! command -v apt-get >/dev/null; then
    echo "note: no apt-get to install ${need[*]}: the sharded-grading tests that need them are skipped"
    exit 0
fi
if [[ $(id -u) -eq 0 ]]; then
    SUDO=()
elif sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
else
    echo "note: installing ${need[*]} needs root (sudo apt-get install ${need[*]});" \
        "the sharded-grading tests that need them are skipped until then"
    exit 0
fi
echo "installing Debian's ${need[*]} (for the sharded-grading tests)"
# A failed install does not stop `make test`: the tests that need these say why they skip
# (and fail under CI).
{ "${SUDO[@]}" apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq "${need[@]}" >/dev/null; } \
    || echo "note: installing ${need[*]} failed; the sharded-grading tests will say what is missing"

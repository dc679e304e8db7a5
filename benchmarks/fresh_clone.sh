# Sourced by benchmarks/main_job.sh and benchmarks/suite_time.sh: `fresh_clone WORKDIR` clones
# the repository that holds the calling script into WORKDIR/clone (emptied first), makes and
# activates a fresh venv in WORKDIR/venv, turns pip's cache off, and leaves the shell in the clone.
fresh_clone() {
    local repo work=$1
    repo=$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel)
    rm -rf "$work" && mkdir -p "$work"
    git clone -q "$repo" "$work/clone"
    cd "$work/clone"
    python -m venv "$work/venv"
    source "$work/venv/bin/activate"
    export PIP_NO_CACHE_DIR=1
}

#!/bin/sh
# gpufleet-epilog.sh: Slurm Epilog that takes the ending job's line out of dcgm-exporter's
# HPC job mapping files, which gpufleet-prolog.sh wrote (see it for the layout and the
# slurm.conf lines). A file left with no job is removed: that GPU's series lose hpc_job.
#
# Every mapping file is searched for the job, not only those of SLURM_JOB_GPUS, so a map
# changed while the job ran leaves nothing behind. A job whose prolog never ran on this
# node (the epilog runs on every node of an allocation, a job cancelled before its first
# step without PrologFlags=Alloc) finds nothing and changes nothing, as does a node with
# no mapping directory.
#
# Settings: the same as the prolog's (/etc/default/gpufleet, GPUFLEET_DEFAULTS).
# It never fails: a non-zero epilog drains the node. Problems go to syslog (tag
# gpufleet-epilog). POSIX sh; needs flock(1) (util-linux).

PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH
umask 022

GPUFLEET_DEFAULTS=${GPUFLEET_DEFAULTS:-/etc/default/gpufleet}
# shellcheck source=/dev/null
[ -r "$GPUFLEET_DEFAULTS" ] && . "$GPUFLEET_DEFAULTS"
dir=${GPUFLEET_HPC_JOB_MAPPING_DIR:-/run/gpufleet/hpc-jobs}
job=${SLURM_JOB_ID:-}

warn() {
    logger -t gpufleet-epilog -p daemon.warning -- "$*" 2>/dev/null || echo "gpufleet-epilog: $*" >&2
}

# dcgm-exporter reads only files named <digits> or <digits>.<digits>; so do we.
mapping_name() {
    case $1 in '' | *[!0-9.]* | .* | *. | *.*.*) return 1 ;; esac
    return 0
}

# Take this job's line (and any blank line) out of one file; remove the file when no job
# is left, else put the rest in place by rename.
remove_job() {
    target=$dir/$1
    tmp=$dir/.$1.$$
    grep -q -x -F -e "$job" -- "$target" 2>/dev/null || return 0
    grep -v -x -F -e "$job" -e '' -- "$target" >"$tmp"
    if [ -s "$tmp" ]; then
        mv -f -- "$tmp" "$target" || { rm -f -- "$tmp"; warn "cannot rewrite $target"; }
    else
        rm -f -- "$tmp" "$target" || warn "cannot remove $target"
    fi
}

case $job in '' | *[!0-9]*)
    warn "SLURM_JOB_ID '$job' is not a job id; nothing removed"
    exit 0
    ;;
esac
[ -d "$dir" ] || exit 0

# `command exec`: a failed redirection of a plain exec would end the script (a drain).
command exec 9>>"$dir/.lock" && flock -w 30 9 || {
    warn "no lock on $dir/.lock in 30 s; job $job left in the mapping files"
    exit 0
}
for target in "$dir"/*; do
    name=${target##*/}
    mapping_name "$name" && [ -f "$target" ] && remove_job "$name"
done
exit 0

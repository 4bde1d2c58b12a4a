#!/bin/sh
# gpufleet-prolog.sh: Slurm Prolog that records which job holds which GPU of this node, in
# dcgm-exporter's HPC job mapping layout, read by `gpufleet agent --hpc-job-mapping-dir`
# (and by dcgm-exporter's --hpc-job-mapping-dir): one file per GPU, named by its index
# ("0", "1"...) or "<gpu>.<GPU instance>" for a MIG instance ("2.1"), one job id a line.
# Its pair, gpufleet-epilog.sh, takes the job's line out again.
#
# slurm.conf on every GPU node (slurmd runs it as SlurmdUser, normally root):
#   Prolog=/etc/slurm/gpufleet-prolog.sh
#   Epilog=/etc/slurm/gpufleet-epilog.sh
#   PrologFlags=Alloc     # at allocation, so salloc sessions and jobs between steps count
#
# The job id written is SLURM_JOB_ID: an array task's own id, the id `squeue` and
# `gpufleet slurm-watch` report and the training client's training_job under Slurm.
# The GPUs are SLURM_JOB_GPUS (slurm.conf(5): "The GPU IDs of GPUs in the job allocation",
# set in Prolog and Epilog): Slurm's GRES index, which under gres.conf AutoDetect=nvml is
# the GPUs in PCI bus order, as NVML and dcgm-exporter number them. For a hand-written
# gres.conf listed in another order, or MIG instances (one GRES each, numbered flat with
# the whole GPUs: Slurm's ids after an instance no longer match NVML's), name the file for
# each id in GPUFLEET_SLURM_GPU_MAP: lines "<Slurm GPU id> <file name>", e.g. "0 0.1",
# "1 0.2", "2 1" for GPU 0's instances 1 and 2, then GPU 1 whole. An id not in the map
# names its file itself.
#
# Settings: /etc/default/gpufleet (GPUFLEET_DEFAULTS names another file), sourced as sh;
# Slurm runs prologs with an environment of its own, so the file is where they go:
#   GPUFLEET_HPC_JOB_MAPPING_DIR  the directory (default /run/gpufleet/hpc-jobs: a tmpfs,
#                                 so a reboot clears jobs whose epilog never ran)
#   GPUFLEET_SLURM_GPU_MAP        Slurm GPU id -> file name (default: none, the id itself)
#
# It never fails the job: a prolog's non-zero exit drains the node and requeues the job
# held, too much for a metrics label. Problems go to syslog (tag gpufleet-prolog).
# POSIX sh; needs flock(1) (util-linux): prologs of jobs starting together run at once.

PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH
umask 022
set -f # SLURM_JOB_GPUS is split on commas below, never globbed

GPUFLEET_DEFAULTS=${GPUFLEET_DEFAULTS:-/etc/default/gpufleet}
# shellcheck source=/dev/null
[ -r "$GPUFLEET_DEFAULTS" ] && . "$GPUFLEET_DEFAULTS"
dir=${GPUFLEET_HPC_JOB_MAPPING_DIR:-/run/gpufleet/hpc-jobs}
gpu_map=${GPUFLEET_SLURM_GPU_MAP:-}
job=${SLURM_JOB_ID:-}

warn() {
    logger -t gpufleet-prolog -p daemon.warning -- "$*" 2>/dev/null || echo "gpufleet-prolog: $*" >&2
}

# dcgm-exporter reads only files named <digits> or <digits>.<digits>; so do we.
mapping_name() {
    case $1 in '' | *[!0-9.]* | .* | *. | *.*.*) return 1 ;; esac
    return 0
}

# The mapping file for one of SLURM_JOB_GPUS' ids: the map's name for it, else the id.
file_for() {
    if [ -n "$gpu_map" ] && [ -r "$gpu_map" ]; then
        mapped=$(awk -v id="$1" '$1 == id { print $2; exit }' "$gpu_map")
        [ -n "$mapped" ] && { echo "$mapped"; return; }
    fi
    echo "$1"
}

# Add this job's line to one file: the other jobs' lines kept, blank lines and an earlier
# line of this job (a prolog run twice) dropped; a new file put in place by rename.
add_job() {
    target=$dir/$1
    tmp=$dir/.$1.$$
    {
        [ -f "$target" ] && grep -v -x -F -e "$job" -e '' -- "$target"
        echo "$job"
    } >"$tmp" && mv -f -- "$tmp" "$target" || { rm -f -- "$tmp"; warn "cannot write $target"; }
}

case $job in '' | *[!0-9]*)
    warn "SLURM_JOB_ID '$job' is not a job id; nothing recorded"
    exit 0
    ;;
esac
[ -n "${SLURM_JOB_GPUS:-}" ] || exit 0 # no GPU on this node for this job

if ! mkdir -p -m 0755 -- "$dir" 2>/dev/null || [ ! -d "$dir" ]; then
    warn "cannot create $dir; job $job not recorded"
    exit 0
fi
# `command exec`: a failed redirection of a plain exec would end the script (a drain).
command exec 9>>"$dir/.lock" && flock -w 30 9 || {
    warn "no lock on $dir/.lock in 30 s; job $job not recorded"
    exit 0
}
for id in $(echo "$SLURM_JOB_GPUS" | tr ',' ' '); do
    name=$(file_for "$id")
    if mapping_name "$name"; then
        add_job "$name"
    else
        warn "GPU '$id' of job $job has no mapping file name ('$name'); see GPUFLEET_SLURM_GPU_MAP"
    fi
done
exit 0

#!/bin/sh
# Slurm EpilogSlurmctld: stores the job-wide mpiburst summary of a job that ended with the job
# itself, as Jobstats does: in the job's AdminComment in the accounting database (sacctmgr; needs
# slurmdbd), prefixed `mpiburst2:` and gzipped in base32 (sacctmgr lowercases what it sets, at
# least up to Slurm 22.05, so the letters' case carries nothing), and/or as a file
# MPIBURST_SUMMARY_DIR/JOBID.json.gz. Either way it is one command away by job id:
#
#   sacct -j JOBID -n -P -o AdminComment | sed -n 's/^mpiburst2://p' | tr a-z A-Z | base32 -d | gunzip
#   gunzip -c /var/lib/mpiburst/jobs/JOBID.json.gz
#
# The summary is `mpiburst report URL --slurm-job JOBID --format json` (docs/report-json.md):
# per step and MPI job of the Slurm job its run time, POP efficiencies, bottlenecks and
# recommendations, and its rank groups, over all of its nodes when URL is the aggregator
# (`mpiburst aggregate`). `cargo xtask install` puts this script in PREFIX/lib/mpiburst/; name it
# in slurm.conf (EpilogSlurmctld=/usr/local/lib/mpiburst/mpiburst-epilog.sh), and give the
# settings in /etc/default/mpiburst-epilog (or the file named by MPIBURST_EPILOG_CONF):
#
#   MPIBURST_URL=http://aggregator.example:9465   # the aggregator, or a daemon for one node
#   MPIBURST_SUMMARY_DIR=/var/lib/mpiburst/jobs   # optional: also keep a file per job
#   MPIBURST_ADMIN_COMMENT=no                      # optional: no AdminComment (no slurmdbd)
#   MPIBURST=/usr/bin/mpiburst                     # optional
#   MPIBURST_EPILOG_WAIT_S=3                       # optional: see below
#
# An epilog's failure must not harm the job: every error is logged (to the epilog's standard
# error, which slurmctld logs) and the script exits 0.

# slurmctld runs its epilogs with an environment of its own, without PATH.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin${PATH:+:$PATH}
export PATH
conf=${MPIBURST_EPILOG_CONF:-/etc/default/mpiburst-epilog}
[ -r "$conf" ] || exit 0
. "$conf"
[ -n "$MPIBURST_URL" ] || exit 0
[ -n "$SLURM_JOB_ID" ] || { echo "mpiburst epilog: SLURM_JOB_ID is not set" >&2; exit 0; }
mpiburst=${MPIBURST:-mpiburst}
# The daemons read their ranks' totals and evaluate the properties once a second: a few seconds
# after the job's end every node has seen its ranks end and evaluated the job with its final totals.
sleep "${MPIBURST_EPILOG_WAIT_S:-3}"

summary=$("$mpiburst" report "$MPIBURST_URL" --slurm-job "$SLURM_JOB_ID" --format json 2>&1) || {
    echo "mpiburst epilog: no summary of job $SLURM_JOB_ID: $summary" >&2
    exit 0
}
if [ -n "$MPIBURST_SUMMARY_DIR" ]; then
    mkdir -p "$MPIBURST_SUMMARY_DIR" &&
        printf '%s' "$summary" | gzip -9 > "$MPIBURST_SUMMARY_DIR/$SLURM_JOB_ID.json.gz.tmp" &&
        mv "$MPIBURST_SUMMARY_DIR/$SLURM_JOB_ID.json.gz.tmp" "$MPIBURST_SUMMARY_DIR/$SLURM_JOB_ID.json.gz" ||
        echo "mpiburst epilog: cannot write the summary of job $SLURM_JOB_ID to $MPIBURST_SUMMARY_DIR" >&2
fi
if [ "$MPIBURST_ADMIN_COMMENT" != no ]; then
    blob=$(printf '%s' "$summary" | gzip -9 | base32 -w0)
    # A job that ended can no longer be updated in slurmctld (scontrol); its accounting record
    # can, once slurmctld has sent it to slurmdbd: a few tries.
    tries=5
    while :; do
        said=$(sacctmgr -i update job where jobid="$SLURM_JOB_ID" set AdminComment="mpiburst2:$blob" 2>&1)
        case $said in *"Modified jobs"*) break ;; esac
        tries=$((tries - 1))
        if [ "$tries" -eq 0 ]; then
            echo "mpiburst epilog: cannot store the summary of job $SLURM_JOB_ID in its AdminComment (is slurmdbd configured?): $said" >&2
            break
        fi
        sleep 2
    done
fi
exit 0

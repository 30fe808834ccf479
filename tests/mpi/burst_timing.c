/*
 * burst_timing.c - ground truth for burst boundaries and durations.
 *
 * A CPU burst is the time between the return of one MPI call and the entry of
 * the next.  This program makes bursts of known length and records, for each,
 * the CLOCK_MONOTONIC time right after the previous MPI call returned (start)
 * and right before the next MPI call (end).  The kernel's bpf_ktime_get_ns()
 * uses the same clock, so a test can match the profiler's bursts one to one.
 *
 * Usage: burst_timing OUTDIR [ITERATIONS=20] [DURATION_US...=1000 5000 20000]
 * Each iteration makes one burst per duration, each ended by MPI_Barrier.
 * Writes OUTDIR/timing.<rank>.json:
 *   {"rank":R,"pid":PID,"bursts":[[start_ns,duration_ns,cpu_ns],...]}
 * cpu_ns is the thread's own CPU time over the same interval (CLOCK_THREAD_CPUTIME_ID): the
 * ground truth for on-CPU time when ranks share cores.
 * The first burst starts when MPI_Init returns.
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include "clock.h"
#include "output.h"

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    long long t_start = now_ns(); /* the first burst begins as MPI_Init returns */
    long long cpu_start = thread_cpu_ns();
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank); /* not probed: does not end the burst */
    if (argc < 2) {
        if (rank == 0)
            fprintf(stderr, "usage: %s OUTDIR [ITERATIONS] [DURATION_US...]\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int iters = argc > 2 ? atoi(argv[2]) : 20;
    long default_us[] = { 1000, 5000, 20000 };
    long *dur_us = default_us;
    int ndur = 3;
    if (argc > 3) {
        ndur = argc - 3;
        dur_us = malloc(ndur * sizeof *dur_us);
        for (int k = 0; k < ndur; k++)
            dur_us[k] = atol(argv[3 + k]);
    }
    long long (*bursts)[3] = malloc((size_t)iters * ndur * sizeof *bursts);
    int n = 0;

    for (int i = 0; i < iters; i++)
        for (int k = 0; k < ndur; k++) {
            long long t_end;
            do /* busy: the burst must be on-CPU time, not sleep */
                t_end = now_ns();
            while (t_end - t_start < dur_us[k] * 1000LL);
            bursts[n][0] = t_start;
            bursts[n][1] = t_end - t_start;
            bursts[n][2] = thread_cpu_ns() - cpu_start;
            n++;
            MPI_Barrier(MPI_COMM_WORLD);
            t_start = now_ns();
            cpu_start = thread_cpu_ns();
        }

    MPI_Finalize();
    return write_bursts(argv[1], "timing", rank, &bursts[0][0], n, 3);
}

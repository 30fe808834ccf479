/*
 * oncpu.c - ground truth for per-burst on-CPU time.
 *
 * Each burst does a fixed amount of CPU work, measured on the thread's own clock
 * (CLOCK_THREAD_CPUTIME_ID) from right after the MPI call that opens it to right before the
 * one that closes it (MPI_Barrier on MPI_COMM_SELF, so ranks never wait for each other). Every
 * third burst sleeps 2 ms in the middle, so it is switched out and back in. Oversubscribed
 * ranks are descheduled in the others too.
 *
 * Usage: oncpu OUTDIR [BURSTS=300]
 * Writes OUTDIR/oncpu.RANK.json: {"rank","pid","bursts":[[start_ns,cpu_ns],...]}, start_ns
 * from CLOCK_MONOTONIC (the clock of the BPF programs) after the opening call returned.
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "clock.h"
#include "output.h"

/* Busy until the thread has run `ns` more nanoseconds. */
static void work(long long ns)
{
    long long t0 = thread_cpu_ns();
    while (thread_cpu_ns() - t0 < ns)
        ;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (argc < 2) {
        if (rank == 0)
            fprintf(stderr, "usage: %s OUTDIR [BURSTS]\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int n = argc > 2 ? atoi(argv[2]) : 300;
    long long (*bursts)[2] = malloc((size_t)n * sizeof *bursts);
    const struct timespec pause = { 0, 2000000 };

    MPI_Barrier(MPI_COMM_SELF);
    for (int i = 0; i < n; i++) {
        long long start = now_ns(), cpu0 = thread_cpu_ns();
        switch (i % 3) {
        case 0:
            work(6000000);
            break;
        case 1:
            work(3000000);
            nanosleep(&pause, NULL);
            work(3000000);
            break;
        default:
            work(2000000);
        }
        bursts[i][0] = start;
        bursts[i][1] = thread_cpu_ns() - cpu0;
        MPI_Barrier(MPI_COMM_SELF);
    }

    MPI_Finalize();
    return write_bursts(argv[1], "oncpu", rank, &bursts[0][0], n, 2);
}

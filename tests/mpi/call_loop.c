/*
 * call_loop.c - micro-benchmark of the cost of one probed MPI call.
 *
 * MPI_Barrier(MPI_COMM_SELF) does almost nothing, so the time per call is
 * dominated by the call itself plus whatever the probes add.  Running it with
 * and without the profiler (or with empty BPF programs) gives the per-call
 * overhead.
 *
 * Usage: call_loop [N=1000000]   meant for 1 rank (every rank runs its own loop)
 * Prints one line to stdout: {"calls":N,"ns_per_call":X}
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include "clock.h"

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    long n = argc > 1 ? atol(argv[1]) : 1000000;

    /* Warm-up: page in the code paths and fill the caches before timing. */
    for (int i = 0; i < 10000; i++)
        MPI_Barrier(MPI_COMM_SELF);

    long long t0 = now_ns();
    for (long i = 0; i < n; i++)
        MPI_Barrier(MPI_COMM_SELF);
    long long t1 = now_ns();

    printf("{\"calls\":%ld,\"ns_per_call\":%.2f}\n", n, (double)(t1 - t0) / (n > 0 ? n : 1));
    MPI_Finalize();
    return 0;
}

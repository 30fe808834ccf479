/*
 * callsites.c - two kinds of burst told apart only by their call site.
 *
 * Each iteration spins 2 ms and calls MPI_Barrier at call site A, then spins
 * 6 ms and calls MPI_Barrier at call site B.  Both calls go to the same MPI
 * function on purpose: the profiler must tell them apart by the return
 * address.  The two call lines carry marker comments (CALLSITE_ followed by
 * A or B) that occur nowhere else in this file, so a test can find their line
 * numbers with grep -n and map them to code addresses with the debug info (-g).
 *
 * Usage: callsites [ITERATIONS=30]      No output; exits 0.
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdlib.h>
#include "clock.h"

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int iters = argc > 1 ? atoi(argv[1]) : 30;
    for (int i = 0; i < iters; i++) {
        spin(0.002);
        MPI_Barrier(MPI_COMM_WORLD); /* CALLSITE_A */
        spin(0.006);
        MPI_Barrier(MPI_COMM_WORLD); /* CALLSITE_B */
    }
    MPI_Finalize();
    return 0;
}

/*
 * imbalance.c - a known load imbalance for the POP efficiency metrics.
 *
 * Per iteration rank 1 spins WORK_MS and every other rank spins a tenth of
 * that, then all call MPI_Allreduce.  With 2 ranks the expected load balance is
 * (1 + 0.1) / 2 / 1 = 0.55; the fast ranks spend the difference in MPI.
 *
 * Usage: imbalance [ITERATIONS=50] [WORK_MS=20]    (meant for 2 ranks)
 * Prints nothing except errors.
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include "clock.h"

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size < 2) {
        fprintf(stderr, "imbalance: needs at least 2 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int iters = argc > 1 ? atoi(argv[1]) : 50;
    double work = (argc > 2 ? atof(argv[2]) : 20.0) * 1e-3;
    if (rank != 1)
        work *= 0.1;

    for (int i = 0; i < iters; i++) {
        double local = rank, sum;
        spin(work);
        MPI_Allreduce(&local, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    }
    MPI_Finalize();
    return 0;
}

/*
 * pop.c - known POP efficiencies, with the program's own measurement as ground truth.
 *
 * Every rank keeps its own account of the POP methodology's quantities: its region of interest
 * (from the return of MPI_Init to the entry of MPI_Finalize) and the wall time inside the MPI
 * calls it makes, both from CLOCK_MONOTONIC around the calls. Work is spun on the wall clock, so
 * the known answers hold however busy the machine is.
 *
 * Modes, per iteration:
 *   imbalance  even ranks spin 20 ms, odd ranks 40 ms, then MPI_Barrier.
 *              2 ranks: LB = (20 + 40) / 2 / 40 = 0.75, CommE ~ 1.
 *   comm       every rank spins 8 ms, MPI_Barrier, then rank (i mod size) spins 12 ms while
 *              the others wait in a second MPI_Barrier: balanced over size iterations, and with
 *              2 ranks useful time is (8 + 6) / 20 = 0.7 of the run: LB ~ 1, CommE ~ 0.7.
 *
 * Usage: pop MODE ITERATIONS OUTDIR
 * Writes OUTDIR/pop.RANK.json: {"rank", "pid", "region_s", "mpi_s", "init_s"}.
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "clock.h"

static double mpi_s;

static void barrier(void)
{
    double t0 = now_s();
    MPI_Barrier(MPI_COMM_WORLD);
    mpi_s += now_s() - t0;
}

int main(int argc, char **argv)
{
    double before_init = now_s();
    MPI_Init(&argc, &argv);
    double region_start = now_s();
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc != 4 || (strcmp(argv[1], "imbalance") && strcmp(argv[1], "comm"))) {
        if (rank == 0)
            fprintf(stderr, "usage: %s imbalance|comm ITERATIONS OUTDIR\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int imbalance = !strcmp(argv[1], "imbalance");
    int iters = atoi(argv[2]);
    for (int i = 0; i < iters; i++) {
        if (imbalance) {
            spin(rank % 2 ? 0.040 : 0.020);
            barrier();
        } else {
            spin(0.008);
            barrier();
            if (i % size == rank)
                spin(0.012);
            barrier();
        }
    }
    double region_end = now_s();
    MPI_Finalize();

    char path[4096];
    snprintf(path, sizeof path, "%s/pop.%d.json", argv[3], rank);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        return 1;
    }
    fprintf(f, "{\"rank\":%d,\"pid\":%ld,\"region_s\":%.9f,\"mpi_s\":%.9f,\"init_s\":%.9f}\n", rank, (long)getpid(),
            region_end - region_start, mpi_s, region_start - before_init);
    fclose(f);
    return 0;
}

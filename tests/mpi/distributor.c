/*
 * distributor: a distributor, workers and a collector, for the rank-group tests.
 *
 * Usage: distributor [TASKS=100] [WORK_MS=1]
 *
 * Rank 0 sends TASKS tasks of 4 KiB to each worker (ranks 1 … N−2); each worker receives a task,
 * works WORK_MS milliseconds of on-CPU time and sends a 64-byte result to the collector (rank
 * N−1), which receives every result. So three roles, three sets of MPI functions: the
 * distributor only sends, the collector only receives, the workers do both. Needs at least 3
 * ranks.
 */
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
    if (size < 3) {
        if (rank == 0)
            fprintf(stderr, "distributor needs at least 3 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int tasks = argc > 1 ? atoi(argv[1]) : 100;
    double work_s = (argc > 2 ? atof(argv[2]) : 1.0) * 1e-3;
    char task[4096] = {0};
    char result[64] = {0};
    int collector = size - 1;
    if (rank == 0) {
        for (int t = 0; t < tasks; t++)
            for (int w = 1; w < collector; w++)
                MPI_Send(task, sizeof task, MPI_CHAR, w, 1, MPI_COMM_WORLD);
    } else if (rank == collector) {
        for (int t = 0; t < tasks; t++)
            for (int w = 1; w < collector; w++)
                MPI_Recv(result, sizeof result, MPI_CHAR, w, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
        for (int t = 0; t < tasks; t++) {
            MPI_Recv(task, sizeof task, MPI_CHAR, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            spin_cpu(work_s);
            result[0] = task[0];
            MPI_Send(result, sizeof result, MPI_CHAR, collector, 2, MPI_COMM_WORLD);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return 0;
}

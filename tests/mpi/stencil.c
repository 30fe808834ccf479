/*
 * stencil: a 2-D halo exchange on PX × PY ranks, for the rank-group tests.
 *
 * Usage: stencil PX PY [ITERATIONS=200] [WORK_MS=0.5]
 *
 * Rank r sits at (r mod PX, r / PX). Each iteration works WORK_MS milliseconds of on-CPU time,
 * then exchanges 1 KiB with each existing neighbour (west, east, north, south): the receives
 * and the sends are posted from one call site each, in a loop over the neighbours, so corner,
 * edge and interior ranks differ only in how many messages they exchange (2, 3 or 4 per
 * iteration), not in their call sites. Every 10th iteration all ranks agree on a residual with
 * MPI_Allreduce. Needs PX × PY ranks.
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
    int px = argc > 2 ? atoi(argv[1]) : 0, py = argc > 2 ? atoi(argv[2]) : 0;
    if (px < 1 || py < 1 || px * py != size) {
        if (rank == 0)
            fprintf(stderr, "usage: stencil PX PY [ITERATIONS] [WORK_MS] with PX × PY ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int iterations = argc > 3 ? atoi(argv[3]) : 200;
    double work_s = (argc > 4 ? atof(argv[4]) : 0.5) * 1e-3;
    int x = rank % px, y = rank / px;
    int neighbour[4] = {
        x > 0 ? rank - 1 : -1,
        x + 1 < px ? rank + 1 : -1,
        y > 0 ? rank - px : -1,
        y + 1 < py ? rank + px : -1,
    };
    static char out[4][1024], in[4][1024];
    MPI_Request requests[8];
    MPI_Status statuses[8];
    double residual = 1.0, sum;
    for (int it = 0; it < iterations; it++) {
        spin_cpu(work_s);
        residual *= 0.999;
        int n = 0;
        for (int d = 0; d < 4; d++)
            if (neighbour[d] >= 0)
                MPI_Irecv(in[d], sizeof in[d], MPI_CHAR, neighbour[d], 0, MPI_COMM_WORLD, &requests[n++]);
        for (int d = 0; d < 4; d++)
            if (neighbour[d] >= 0)
                MPI_Isend(out[d], sizeof out[d], MPI_CHAR, neighbour[d], 0, MPI_COMM_WORLD, &requests[n++]);
        MPI_Waitall(n, requests, statuses);
        if (it % 10 == 9)
            MPI_Allreduce(&residual, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    }
    MPI_Finalize();
    return 0;
}

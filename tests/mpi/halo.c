/*
 * halo: a 2-D Jacobi relaxation on a periodic grid of ranks, for `cargo xtask bench apps`.
 *
 * Usage: halo [ITERATIONS=4000] [N=512]
 *
 * Each rank owns an N × N block (plus a ring of halo cells) of a grid decomposed over the ranks
 * by MPI_Dims_create. Each iteration posts MPI_Irecv and MPI_Isend for the four halos (rows
 * contiguous, columns as an MPI_Type_vector), waits for all eight with MPI_Waitall, then
 * relaxes every interior point with the five-point stencil. With one rank along a dimension the
 * neighbour there is the rank itself.
 *
 * Rank 0 prints one line: "halo: checksum C, I iterations, timed T s", C being the sum of the
 * squares of the whole grid after the last iteration (so the work cannot be optimised away) and
 * T the wall time of the iterations between two barriers.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int iterations = argc > 1 ? atoi(argv[1]) : 4000;
    int n = argc > 2 ? atoi(argv[2]) : 512;
    if (iterations < 1 || n < 2) {
        if (rank == 0)
            fprintf(stderr, "usage: halo [ITERATIONS >= 1] [N >= 2]\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int dims[2] = {0, 0}, periods[2] = {1, 1};
    MPI_Dims_create(size, 2, dims);
    MPI_Comm grid;
    MPI_Cart_create(MPI_COMM_WORLD, 2, dims, periods, 0, &grid);
    int north, south, west, east;
    MPI_Cart_shift(grid, 0, 1, &north, &south);
    MPI_Cart_shift(grid, 1, 1, &west, &east);

    /* Row-major (n + 2) × (n + 2) blocks with a halo ring; two of them, swapped each iteration. */
    int w = n + 2;
    double *old = calloc((size_t)w * w, sizeof *old), *new = calloc((size_t)w * w, sizeof *new);
    if (!old || !new) {
        fprintf(stderr, "halo: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (int i = 1; i <= n; i++)
        for (int j = 1; j <= n; j++)
            old[i * w + j] = (double)((rank * 7 + i * 3 + j) % 17);
    MPI_Datatype column;
    MPI_Type_vector(n, 1, w, MPI_DOUBLE, &column);
    MPI_Type_commit(&column);

    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    for (int it = 0; it < iterations; it++) {
        MPI_Request requests[8];
        MPI_Status statuses[8];
        MPI_Irecv(&old[0 * w + 1], n, MPI_DOUBLE, north, 0, grid, &requests[0]);
        MPI_Irecv(&old[(n + 1) * w + 1], n, MPI_DOUBLE, south, 1, grid, &requests[1]);
        MPI_Irecv(&old[1 * w + 0], 1, column, west, 2, grid, &requests[2]);
        MPI_Irecv(&old[1 * w + n + 1], 1, column, east, 3, grid, &requests[3]);
        MPI_Isend(&old[n * w + 1], n, MPI_DOUBLE, south, 0, grid, &requests[4]);
        MPI_Isend(&old[1 * w + 1], n, MPI_DOUBLE, north, 1, grid, &requests[5]);
        MPI_Isend(&old[1 * w + n], 1, column, east, 2, grid, &requests[6]);
        MPI_Isend(&old[1 * w + 1], 1, column, west, 3, grid, &requests[7]);
        MPI_Waitall(8, requests, statuses);
        for (int i = 1; i <= n; i++)
            for (int j = 1; j <= n; j++)
                new[i * w + j] = 0.2 * (old[i * w + j] + old[(i - 1) * w + j] + old[(i + 1) * w + j] +
                                        old[i * w + j - 1] + old[i * w + j + 1]);
        double *t = old;
        old = new;
        new = t;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double timed = MPI_Wtime() - start;

    double local = 0.0, checksum;
    for (int i = 1; i <= n; i++)
        for (int j = 1; j <= n; j++)
            local += old[i * w + j] * old[i * w + j];
    MPI_Reduce(&local, &checksum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf("halo: checksum %.17g, %d iterations, timed %.6f s\n", checksum, iterations, timed);
    MPI_Type_free(&column);
    MPI_Comm_free(&grid);
    free(old);
    free(new);
    MPI_Finalize();
    return 0;
}

/*
 * demo.c - the bundled demo application for `cargo xtask demo` (2-4 ranks).
 *
 * A toy time-stepping solver whose steps have phases a profiler should find:
 *   1. compute  - a smoothing sweep of a small 1-D field, then repeated dense
 *                 matrix products on cache-resident data: flop-bound;
 *   2. halo     - MPI_Sendrecv of the field's edges with both ring neighbours;
 *   3. stream   - triad passes over arrays larger than the last-level cache:
 *                 memory-bound; the last rank makes 1.5x as many passes;
 *   4. residual - MPI_Allreduce of the residual, which also carries rank 0's
 *                 stop flag so that every rank stops after the same step;
 *   5. every 10th step a small MPI_Bcast of a solver parameter.
 * Phases 1 and 3 are separated by MPI calls, so they show up as distinct
 * bursts with different hardware behaviour.  A step takes ~30 ms with 2 ranks
 * on a 2-core machine.
 *
 * Usage: demo [SECONDS=20]
 * Rank 0 prints progress about every 2 s and a summary line at the end.
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

enum {
    M = 128,           /* matrix order: 3 matrices of 128 KiB stay in L2 */
    REPS = 32,         /* matrix products per step */
    NS = 1 << 21,      /* stream arrays: 3 x 16 MiB per rank, beyond the L3 */
    PASSES = 8,        /* triad passes per step (x1.5 on the last rank) */
    NU = 1 << 16,      /* smoothed field, plus HALO ghost cells at each end */
    HALO = 1024,
};

static double A[M][M], B[M][M], C[M][M];

/* Phase 1: one Jacobi-like sweep of u into v (returns the squared change),
 * then C = A * B, REPS times, in i-k-j order so the inner loop vectorises. */
static double compute(const double *u, double *v, double omega)
{
    double res = 0.0;
    for (long i = HALO; i < NU + HALO; i++) {
        double d = omega * (0.5 * (u[i - 1] + u[i + 1]) - u[i]);
        v[i] = u[i] + d;
        res += d * d;
    }
    for (int r = 0; r < REPS; r++)
        for (int i = 0; i < M; i++) {
            for (int j = 0; j < M; j++)
                C[i][j] = 0.0;
            for (int k = 0; k < M; k++)
                for (int j = 0; j < M; j++)
                    C[i][j] += A[i][k] * B[k][j];
        }
    return res + 1e-30 * C[M / 2][M / 2]; /* use C so the products are not optimised away */
}

/* Phase 3: triad a = b + s*c, passes times. */
static double stream(double *a, const double *b, const double *c, int passes)
{
    for (int p = 0; p < passes; p++)
        for (long i = 0; i < NS; i++)
            a[i] = b[i] + 0.5 * c[i];
    return a[NS / 2];
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    double seconds = argc > 1 ? atof(argv[1]) : 20.0;
    const int left = (rank + size - 1) % size, right = (rank + 1) % size;
    /* The imbalance: the last rank streams 1.5x as much. */
    const int passes = rank == size - 1 ? PASSES * 3 / 2 : PASSES;

    double *a = malloc(NS * sizeof *a), *b = malloc(NS * sizeof *b), *c = malloc(NS * sizeof *c);
    double *u = malloc((NU + 2 * HALO) * sizeof *u), *v = malloc((NU + 2 * HALO) * sizeof *v);
    if (!a || !b || !c || !u || !v) {
        fprintf(stderr, "demo: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < M; j++) {
            A[i][j] = 1.0 / (1 + i + j);
            B[i][j] = (i == j) ? 1.0 : 1e-3;
        }
    for (long i = 0; i < NS; i++) {
        a[i] = 0.0;
        b[i] = 1.0;
        c[i] = i % 7;
    }
    for (long i = 0; i < NU + 2 * HALO; i++)
        u[i] = v[i] = (rank * NU + i) % 100;

    double omega = 0.8, res = 0.0;
    const double t0 = MPI_Wtime();
    double next_report = 2.0;
    int step, stop = 0;
    for (step = 1; !stop; step++) {
        double local[2] = { compute(u, v, omega), 0.0 };
        double *t = u;
        u = v;
        v = t;

        /* Halo: my right edge goes right while the left ghosts come from the
         * left, and the other way round. */
        MPI_Sendrecv(u + NU, HALO, MPI_DOUBLE, right, 0, u, HALO, MPI_DOUBLE, left, 0,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Sendrecv(u + HALO, HALO, MPI_DOUBLE, left, 1, u + NU + HALO, HALO, MPI_DOUBLE,
                     right, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);

        local[0] += 1e-30 * stream(a, b, c, passes);

        /* Rank 0 alone decides when to stop; the sum carries its flag to all. */
        if (rank == 0)
            local[1] = MPI_Wtime() - t0 >= seconds;
        double global[2];
        MPI_Allreduce(local, global, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        res = global[0];
        stop = global[1] > 0.0;

        if (step % 10 == 0) {
            /* Rank 0 adapts the relaxation weight; the others must follow. */
            if (rank == 0)
                omega = omega > 0.9 ? 0.8 : omega + 0.01;
            MPI_Bcast(&omega, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        }
        if (rank == 0 && MPI_Wtime() - t0 >= next_report) {
            printf("demo: step %d, %.1f s\n", step, MPI_Wtime() - t0);
            fflush(stdout);
            next_report += 2.0;
        }
    }
    if (rank == 0) {
        double el = MPI_Wtime() - t0;
        printf("demo: done, %d steps on %d ranks in %.1f s (%.1f ms/step), residual %.3e\n",
               step - 1, size, el, 1e3 * el / (step - 1), res);
    }
    free(a);
    free(b);
    free(c);
    free(u);
    free(v);
    MPI_Finalize();
    return 0;
}

/*
 * solver: conjugate gradients with two MPI_Allreduce per iteration, for `cargo xtask bench apps`.
 *
 * Usage: solver [ITERATIONS=2000] [N=100000]
 *
 * Solves A x = b for the block-diagonal matrix A whose blocks, one per rank, are the N × N
 * tridiagonal matrix tridiag(-1, 2.0001, -1), with b = 1 everywhere. Each rank keeps its block
 * of every vector; each iteration applies A locally and sums the two dot products (p·Ap, then
 * r·r) over the ranks with MPI_Allreduce, as a distributed CG does. The matrix is ill-conditioned
 * enough that the iterations do not converge early; should the residual vanish, the loop stops.
 *
 * Rank 0 prints one line: "solver: checksum C, I iterations, timed T s", C being the sum of x
 * over all ranks plus the final squared residual norm (so the work cannot be optimised away) and T the
 * wall time of the iterations between two barriers.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

/* y = A x for one tridiagonal block. */
static void apply(const double *x, double *y, int n)
{
    for (int i = 0; i < n; i++)
        y[i] = 2.0001 * x[i] - (i > 0 ? x[i - 1] : 0.0) - (i + 1 < n ? x[i + 1] : 0.0);
}

static double global_dot(const double *a, const double *b, int n)
{
    double local = 0.0, sum;
    for (int i = 0; i < n; i++)
        local += a[i] * b[i];
    MPI_Allreduce(&local, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return sum;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int iterations = argc > 1 ? atoi(argv[1]) : 2000;
    int n = argc > 2 ? atoi(argv[2]) : 100000;
    if (iterations < 1 || n < 1) {
        if (rank == 0)
            fprintf(stderr, "usage: solver [ITERATIONS >= 1] [N >= 1]\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    double *x = calloc(n, sizeof *x), *r = calloc(n, sizeof *r), *p = calloc(n, sizeof *p),
           *ap = calloc(n, sizeof *ap);
    if (!x || !r || !p || !ap) {
        fprintf(stderr, "solver: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* x = 0, so r = b - A x = b. */
    for (int i = 0; i < n; i++)
        r[i] = p[i] = 1.0;
    double rr = global_dot(r, r, n);

    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    int done = 0;
    while (done < iterations && rr > 0.0) {
        apply(p, ap, n);
        double alpha = rr / global_dot(p, ap, n);
        for (int i = 0; i < n; i++) {
            x[i] += alpha * p[i];
            r[i] -= alpha * ap[i];
        }
        double next = global_dot(r, r, n);
        double beta = next / rr;
        for (int i = 0; i < n; i++)
            p[i] = r[i] + beta * p[i];
        rr = next;
        done++;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double timed = MPI_Wtime() - start;

    double local = 0.0, sum;
    for (int i = 0; i < n; i++)
        local += x[i];
    MPI_Reduce(&local, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf("solver: checksum %.17g, %d iterations, timed %.6f s\n", sum + rr, done, timed);
    free(x);
    free(r);
    free(p);
    free(ap);
    MPI_Finalize();
    return 0;
}

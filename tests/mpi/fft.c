/*
 * fft: a spectral solver step on an N × N grid, for the tests of phases when ranks share cores.
 *
 * Usage: fft [n=N] [iters=I]
 *
 *   n      grid side, a power of two divisible by the rank count (default 1024)
 *   iters  solver steps (default 30)
 *
 * Each rank holds N / size rows of complex values (16 MiB over all ranks at N = 1024, more than a
 * core's second-level cache per rank), so ranks that share a core evict each other's data and
 * the same computation takes longer on them: the case that splits a code region along rank
 * lines. Each step is three computations, each ended by its own MPI call on its own line:
 *   1. forward FFT of every local row, then the transpose (MPI_Alltoall);
 *   2. FFT of every local row of the transposed grid, a spectral filter, the inverse FFT, then
 *      the transpose back (MPI_Alltoall);
 *   3. inverse FFT of every local row and the step's residual (MPI_Allreduce).
 * The program prints nothing: the tests compare the phases found with these three.
 */
#include <complex.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* In-place iterative radix-2 FFT of n points (n a power of two); sign -1 forward, +1 inverse
 * (unscaled). */
static void fft1d(double complex *x, int n, const double complex *twiddle, int sign)
{
    for (int i = 1, j = 0; i < n; i++) {
        int bit = n >> 1;
        for (; j & bit; bit >>= 1)
            j ^= bit;
        j ^= bit;
        if (i < j) {
            double complex t = x[i];
            x[i] = x[j];
            x[j] = t;
        }
    }
    for (int len = 2; len <= n; len <<= 1) {
        int stride = n / len;
        for (int i = 0; i < n; i += len)
            for (int k = 0; k < len / 2; k++) {
                double complex w = twiddle[k * stride];
                if (sign > 0)
                    w = conj(w);
                double complex u = x[i + k], v = x[i + k + len / 2] * w;
                x[i + k] = u + v;
                x[i + k + len / 2] = u - v;
            }
    }
}

/* Rows of `rows` × n values in `from`, laid out for MPI_Alltoall as `size` blocks of
 * rows × (n / size): block b holds columns b·rows … (b+1)·rows − 1. */
static void pack(double complex *to, const double complex *from, int rows, int n, int size)
{
    for (int b = 0; b < size; b++)
        for (int r = 0; r < rows; r++)
            memcpy(to + (size_t)b * rows * rows + (size_t)r * rows, from + (size_t)r * n + (size_t)b * rows,
                   sizeof *to * rows);
}

/* The inverse of a transpose across ranks: block b of `from` came from rank b and holds its rows
 * of our columns; transposing each block gives our rows of the transposed grid. */
static void unpack(double complex *to, const double complex *from, int rows, int n, int size)
{
    for (int b = 0; b < size; b++)
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < rows; c++)
                to[(size_t)c * n + (size_t)b * rows + r] = from[(size_t)b * rows * rows + (size_t)r * rows + c];
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int n = 1024, iters = 30;
    for (int a = 1; a < argc; a++) {
        if (!strncmp(argv[a], "n=", 2))
            n = atoi(argv[a] + 2);
        else if (!strncmp(argv[a], "iters=", 6))
            iters = atoi(argv[a] + 6);
        else {
            if (rank == 0)
                fprintf(stderr, "fft: unknown argument %s (usage: fft [n=N] [iters=I])\n", argv[a]);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    if (n < 2 || (n & (n - 1)) || n % size) {
        if (rank == 0)
            fprintf(stderr, "fft: n=%d must be a power of two divisible by the %d ranks\n", n, size);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int rows = n / size;
    size_t local = (size_t)rows * n;
    double complex *grid = malloc(sizeof *grid * local), *buf = malloc(sizeof *buf * local),
                   *twiddle = malloc(sizeof *twiddle * n / 2);
    if (!grid || !buf || !twiddle) {
        fprintf(stderr, "fft: out of memory for n=%d\n", n);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (int k = 0; k < n / 2; k++)
        twiddle[k] = cexp(-2.0 * M_PI * I * k / n);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < n; c++) {
            double y = (double)(rank * rows + r) / n, x = (double)c / n;
            grid[(size_t)r * n + c] = sin(2 * M_PI * x) * cos(4 * M_PI * y) + 0.01 * ((r * 31 + c * 17) % 7);
        }
    double residual = 0, total;
    for (int it = 0; it < iters; it++) {
        /* 1. Forward FFT along x, then the transpose. */
        for (int r = 0; r < rows; r++)
            fft1d(grid + (size_t)r * n, n, twiddle, -1);
        pack(buf, grid, rows, n, size);
        MPI_Alltoall(buf, 2 * rows * rows, MPI_DOUBLE, grid, 2 * rows * rows, MPI_DOUBLE, MPI_COMM_WORLD);
        /* 2. FFT along y, a spectral filter, the inverse FFT along y, then the transpose back. */
        unpack(buf, grid, rows, n, size);
        for (int r = 0; r < rows; r++) {
            double complex *row = buf + (size_t)r * n;
            fft1d(row, n, twiddle, -1);
            int kx = rank * rows + r, kxs = kx <= n / 2 ? kx : n - kx;
            for (int c = 0; c < n; c++) {
                int ky = c <= n / 2 ? c : n - c;
                row[c] *= 1.0 / (1.0 + 1e-4 * (kxs * kxs + ky * ky)) / ((double)n * n);
            }
            fft1d(row, n, twiddle, +1);
        }
        pack(grid, buf, rows, n, size);
        MPI_Alltoall(grid, 2 * rows * rows, MPI_DOUBLE, buf, 2 * rows * rows, MPI_DOUBLE, MPI_COMM_WORLD);
        /* 3. Inverse FFT along x and the step's residual. */
        unpack(grid, buf, rows, n, size);
        residual = 0;
        for (int r = 0; r < rows; r++) {
            double complex *row = grid + (size_t)r * n;
            fft1d(row, n, twiddle, +1);
            for (int c = 0; c < n; c++)
                residual += cabs(row[c]);
        }
        MPI_Allreduce(&residual, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    }
    free(grid);
    free(buf);
    free(twiddle);
    MPI_Finalize();
    return total < 0; /* never: keeps the result live */
}

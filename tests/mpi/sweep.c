/*
 * sweep: a 2-D wavefront (pipeline) code with a stencil update and known computations, for the
 * phase-analysis tests.
 *
 * Usage: sweep OUTDIR [iters=N] [ms=A,B,C] [grid=PXxPY]
 *
 *   iters  iterations (default 30)
 *   ms     work of the three computations in milliseconds of one core (default 3,8,20)
 *   grid   the rank grid (default: PY the largest divisor of the size up to its square root)
 *
 * Rank r sits at (x, y) = (r mod PX, r div PX) of a PX×PY grid. Each iteration runs
 *
 *   0 sweep_a  a forward sweep: receive from the west and north neighbours (if any), compute,
 *              send to the east and south neighbours (if any);
 *   1 sweep_b  a second forward sweep through the same routine, with other work;
 *              then a halo exchange (MPI_Sendrecv with each neighbour there is, one call per
 *              direction, as stencil codes write it);
 *   2 update   a local computation, then the halo exchange again.
 *
 * There is no collective in the loop, so no call site is common to all ranks: the same
 * computation sits between different MPI calls depending on the rank's position. The corner
 * (0, 0) receives nothing, the opposite corner sends nothing and runs sweep_a from its last
 * receive up to the receives of sweep_b, edge ranks have fewer neighbours, and the update starts
 * and ends at the sites of the rank's first and last halo direction. A phase analysis must
 * still see one phase per computation.
 *
 * Writes OUTDIR/sweep.<rank>.json after MPI_Finalize:
 *   {"rank":R,"pid":P,"grid":[PX,PY],"computations":["sweep_a","sweep_b","update"],
 *    "items":[[COMPUTATION,START_NS,END_NS],...]}
 * one item per computation run, with CLOCK_MONOTONIC times taken right before and after its work
 * (the clock of bpf_ktime_get_ns()), so a test can tell which computation each burst ran.
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "work.h"

#define COMPUTATIONS 3
static const char *const names[COMPUTATIONS] = {"sweep_a", "sweep_b", "update"};

struct item {
    int computation;
    long long start_ns, end_ns;
};

static struct item *items;
static int nitems;

static void compute(int c, long units)
{
    items[nitems].computation = c;
    items[nitems].start_ns = now_ns();
    work(units);
    items[nitems].end_ns = now_ns();
    nitems++;
}

/* Exchanges one value with each neighbour there is (-1: none), one call site per direction. */
__attribute__((noinline)) static void halo(int west, int east, int north, int south, double *value)
{
    double out = *value, in;
    if (west >= 0) {
        MPI_Sendrecv(&out, 1, MPI_DOUBLE, west, 9, &in, 1, MPI_DOUBLE, west, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        *value += in;
    }
    if (east >= 0) {
        MPI_Sendrecv(&out, 1, MPI_DOUBLE, east, 9, &in, 1, MPI_DOUBLE, east, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        *value += in;
    }
    if (north >= 0) {
        MPI_Sendrecv(&out, 1, MPI_DOUBLE, north, 9, &in, 1, MPI_DOUBLE, north, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        *value += in;
    }
    if (south >= 0) {
        MPI_Sendrecv(&out, 1, MPI_DOUBLE, south, 9, &in, 1, MPI_DOUBLE, south, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        *value += in;
    }
    /* Work after the calls keeps the compiler from turning the last one into a tail call, whose
     * return address would be the caller's. */
    work_sink = *value;
}

/* One wavefront step of this rank: both sweeps share it, as a code sweeping several angle sets
 * or energy groups shares its communication routine. Neighbours are -1 when absent. */
__attribute__((noinline)) static void sweep(int c, long units, int west, int north, int east, int south, double *flux)
{
    double in;
    if (west >= 0) {
        MPI_Recv(&in, 1, MPI_DOUBLE, west, c, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        *flux += in;
    }
    if (north >= 0) {
        MPI_Recv(&in, 1, MPI_DOUBLE, north, c, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        *flux += in;
    }
    compute(c, units);
    if (east >= 0)
        MPI_Send(flux, 1, MPI_DOUBLE, east, c, MPI_COMM_WORLD);
    if (south >= 0)
        MPI_Send(flux, 1, MPI_DOUBLE, south, c, MPI_COMM_WORLD);
    work_sink = *flux;
}

static void usage(int rank, const char *message)
{
    if (rank == 0)
        fprintf(stderr, "sweep: %s\nusage: sweep OUTDIR [iters=N] [ms=A,B,C] [grid=PXxPY]\n", message);
    MPI_Abort(MPI_COMM_WORLD, 2);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc < 2)
        usage(rank, "missing OUTDIR");

    int iters = 30, px = 0, py = 0;
    double ms[COMPUTATIONS] = {3, 8, 20};
    for (int a = 2; a < argc; a++) {
        const char *v = strchr(argv[a], '=');
        if (!v)
            usage(rank, "arguments after OUTDIR are key=value");
        v++;
        if (!strncmp(argv[a], "iters=", 6)) {
            iters = atoi(v);
        } else if (!strncmp(argv[a], "ms=", 3)) {
            if (sscanf(v, "%lf,%lf,%lf", &ms[0], &ms[1], &ms[2]) != COMPUTATIONS)
                usage(rank, "ms= takes three values");
        } else if (!strncmp(argv[a], "grid=", 5)) {
            if (sscanf(v, "%dx%d", &px, &py) != 2)
                usage(rank, "grid= takes PXxPY");
        } else {
            usage(rank, "unknown argument");
        }
    }
    if (px == 0) {
        for (py = 1; (py + 1) * (py + 1) <= size; py++)
            ;
        while (size % py)
            py--;
        px = size / py;
    }
    if (px * py != size || size < 2 || iters < 1)
        usage(rank, "the grid must hold exactly the ranks (at least 2), and iters must be positive");
    int x = rank % px, y = rank / px;
    int west = x > 0 ? rank - 1 : -1, east = x < px - 1 ? rank + 1 : -1;
    int north = y > 0 ? rank - px : -1, south = y < py - 1 ? rank + px : -1;

    items = malloc((size_t)iters * COMPUTATIONS * sizeof *items);
    double per_ms = rank == 0 ? work_units_per_ms() : 0;
    MPI_Bcast(&per_ms, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    long units[COMPUTATIONS];
    for (int c = 0; c < COMPUTATIONS; c++)
        units[c] = (long)(ms[c] * per_ms);

    double flux = 1, field = 1;
    double t0 = now_s();
    for (int it = 0; it < iters; it++) {
        sweep(0, units[0], west, north, east, south, &flux);
        sweep(1, units[1], west, north, east, south, &flux);
        halo(west, east, north, south, &flux);
        compute(2, units[2]);
        field += flux;
        halo(west, east, north, south, &field);
    }
    if (rank == 0)
        printf("sweep: %d computations (%s %g ms, %s %g ms, %s %g ms) on a %dx%d grid, %d iterations in %.2f s\n",
               COMPUTATIONS, names[0], ms[0], names[1], ms[1], names[2], ms[2], px, py, iters, now_s() - t0);

    /* Written after MPI_Finalize, so file I/O does not fall inside a recorded burst. */
    MPI_Finalize();
    char path[4096];
    snprintf(path, sizeof path, "%s/sweep.%d.json", argv[1], rank);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        return 1;
    }
    fprintf(f, "{\"rank\":%d,\"pid\":%ld,\"grid\":[%d,%d],\"computations\":[", rank, (long)getpid(), px, py);
    for (int c = 0; c < COMPUTATIONS; c++)
        fprintf(f, "%s\"%s\"", c ? "," : "", names[c]);
    fprintf(f, "],\"items\":[");
    for (int i = 0; i < nitems; i++)
        fprintf(f, "%s[%d,%lld,%lld]", i ? "," : "", items[i].computation, items[i].start_ns, items[i].end_ns);
    fprintf(f, "]}\n");
    return fclose(f) == 0 ? 0 : 1;
}

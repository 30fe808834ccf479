/*
 * phases: an SPMD loop of K computation phases with known work, for the phase-analysis tests.
 *
 * Usage: phases [iters=N] [ms=A,B,C...] [imbalance=RANKS:PHASE:FACTOR]
 *               [alternate=PHASE:FACTOR] [change=ITER:PHASE:FACTOR]
 *
 *   iters      iterations of the loop (default 100)
 *   ms         work of each phase in milliseconds of one core (default 2,6,12); K = their count
 *   imbalance  RANKS (one rank, or FIRST-LAST) do FACTOR times the work of PHASE (for example
 *              0:1:1.5, or 2-3:1:1.5 for ranks 2 and 3)
 *   alternate  PHASE does FACTOR times its work on odd iterations (a bi-modal phase)
 *   change     from iteration ITER on, PHASE does FACTOR times its work (a phase change)
 *
 * Work is a fixed amount of arithmetic, calibrated once on rank 0 and broadcast, so a phase costs
 * the same on-CPU time in every rank even when ranks share cores.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "work.h"

#define MAX_PHASES 8

/* Ends phase p in its own MPI call, on its own source line, so each phase is its own code region
 * (pair of call sites). Phase 2's broadcast also carries the calibration, so the loop's first
 * burst starts at the same call site as all later ones (not inlined: one copy, one call site). */
__attribute__((noinline)) static void end_phase(int p, double *value)
{
    double sum;
    switch (p) {
    case 0: MPI_Barrier(MPI_COMM_WORLD); break;
    case 1: MPI_Allreduce(value, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD); break;
    case 2: MPI_Bcast(value, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD); break;
    case 3: MPI_Barrier(MPI_COMM_WORLD); break;
    case 4: MPI_Allreduce(value, &sum, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD); break;
    case 5: MPI_Bcast(value, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD); break;
    case 6: MPI_Barrier(MPI_COMM_WORLD); break;
    default: MPI_Allreduce(value, &sum, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD); break;
    }
    /* Work after the call keeps the compiler from turning it into a tail call, whose return
     * address would be the caller's. */
    work_sink = *value;
}

/* Work units per millisecond of one core, measured on rank 0 and shared. */
static double calibrate(int rank)
{
    double per_ms = rank == 0 ? work_units_per_ms() : 0;
    end_phase(2, &per_ms);
    return per_ms;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    int iters = 100, k = 3;
    double ms[MAX_PHASES] = {2, 6, 12};
    int imb_first = -1, imb_last = -1, imb_phase = -1, alt_phase = -1, chg_iter = -1, chg_phase = -1;
    double imb_factor = 1, alt_factor = 1, chg_factor = 1;
    for (int a = 1; a < argc; a++) {
        const char *v = strchr(argv[a], '=');
        if (!v) {
            fprintf(stderr, "phases: arguments are key=value, got %s\n", argv[a]);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        v++;
        if (!strncmp(argv[a], "iters=", 6)) {
            iters = atoi(v);
        } else if (!strncmp(argv[a], "ms=", 3)) {
            k = 0;
            for (char *s = (char *)v; *s && k < MAX_PHASES; s = strchr(s, ',') ? strchr(s, ',') + 1 : s + strlen(s))
                ms[k++] = atof(s);
        } else if (!strncmp(argv[a], "imbalance=", 10)) {
            if (sscanf(v, "%d-%d:%d:%lf", &imb_first, &imb_last, &imb_phase, &imb_factor) != 4) {
                sscanf(v, "%d:%d:%lf", &imb_first, &imb_phase, &imb_factor);
                imb_last = imb_first;
            }
        } else if (!strncmp(argv[a], "alternate=", 10)) {
            sscanf(v, "%d:%lf", &alt_phase, &alt_factor);
        } else if (!strncmp(argv[a], "change=", 7)) {
            sscanf(v, "%d:%d:%lf", &chg_iter, &chg_phase, &chg_factor);
        } else {
            fprintf(stderr, "phases: unknown argument %s\n", argv[a]);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }

    double per_ms = calibrate(rank);
    double token = 1;
    double t0 = now_s();
    for (int it = 0; it < iters; it++) {
        for (int p = 0; p < k; p++) {
            double f = 1;
            if (p == imb_phase && rank >= imb_first && rank <= imb_last)
                f *= imb_factor;
            if (p == alt_phase && it % 2 == 1)
                f *= alt_factor;
            if (p == chg_phase && chg_iter >= 0 && it >= chg_iter)
                f *= chg_factor;
            work((long)(ms[p] * f * per_ms));
            end_phase(p, &token);
        }
    }
    if (rank == 0)
        printf("phases: %d iterations of %d phases on %d ranks in %.2f s\n", iters, k, size, now_s() - t0);
    MPI_Finalize();
    return 0;
}

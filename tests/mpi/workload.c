/*
 * workload: an application whose run time follows its workload value n, for the signature and
 * run-time prediction tests. Its loop runs iters_per_n * n iterations of two phases: a linear
 * one of n * linear_ms milliseconds of one core, and a quadratic one of n² * quadratic_ms. With
 * max_iterations=M it stops after M iterations if that comes first, as a simulation stops at its
 * end time or at an iteration cap.
 *
 * Usage: workload n=N [iters_per_n=K] [max_iterations=M] [linear_ms=A] [quadratic_ms=B]
 *        [units_per_ms=U] (defaults 10, no cap, 0.5, 0.3, calibrated)
 *
 * Work is a fixed amount of arithmetic, calibrated on rank 0 and broadcast; runs that are to do
 * the same work per unit of n pass one calibration as units_per_ms. Rank 0 prints its own region
 * of interest, MPI_Init's return to MPI_Finalize's entry, the units of work it did with their
 * thread CPU time (how fast the CPU ran this run's work) and the calibration, as
 * "workload: n=N iterations=I region_s=S work_units=K work_cpu_s=C units_per_ms=U".
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "work.h"

/* Each phase ends in its own MPI call on its own line, so each is its own code region. Not
 * inlined: one copy, one call site; the work after the call keeps it from being a tail call. */
__attribute__((noinline)) static void end_linear(double *value)
{
    double sum;
    MPI_Allreduce(value, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    work_sink = sum;
}

__attribute__((noinline)) static void end_quadratic(double *value)
{
    MPI_Bcast(value, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    work_sink = *value;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    double start = now_s();
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);

    double n = 0, iters_per_n = 10, linear_ms = 0.5, quadratic_ms = 0.3, units_per_ms = 0;
    int max_iterations = 0;
    for (int a = 1; a < argc; a++) {
        const char *v = strchr(argv[a], '=');
        if (!v) {
            fprintf(stderr, "workload: arguments are key=value, got %s\n", argv[a]);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        v++;
        if (!strncmp(argv[a], "n=", 2))
            n = atof(v);
        else if (!strncmp(argv[a], "iters_per_n=", 12))
            iters_per_n = atof(v);
        else if (!strncmp(argv[a], "max_iterations=", 15))
            max_iterations = atoi(v);
        else if (!strncmp(argv[a], "linear_ms=", 10))
            linear_ms = atof(v);
        else if (!strncmp(argv[a], "quadratic_ms=", 13))
            quadratic_ms = atof(v);
        else if (!strncmp(argv[a], "units_per_ms=", 13))
            units_per_ms = atof(v);
        else {
            fprintf(stderr, "workload: unknown argument %s\n", argv[a]);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    if (n <= 0) {
        fprintf(stderr, "workload: n=N with N > 0 is required\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }

    double per_ms = rank != 0 ? 0 : units_per_ms > 0 ? units_per_ms : work_units_per_ms();
    end_quadratic(&per_ms);
    int iterations = (int)(iters_per_n * n + 0.5);
    if (max_iterations > 0 && iterations > max_iterations)
        iterations = max_iterations;
    double token = 1;
    long long work_cpu_ns = 0;
    long linear_units = (long)(n * linear_ms * per_ms);
    long quadratic_units = (long)(n * n * quadratic_ms * per_ms);
    for (int it = 0; it < iterations; it++) {
        long long cpu = thread_cpu_ns();
        work(linear_units);
        work_cpu_ns += thread_cpu_ns() - cpu;
        end_linear(&token);
        cpu = thread_cpu_ns();
        work(quadratic_units);
        work_cpu_ns += thread_cpu_ns() - cpu;
        end_quadratic(&token);
    }
    double region = now_s() - start;
    if (rank == 0)
        printf("workload: n=%g iterations=%d region_s=%.6f work_units=%ld work_cpu_s=%.6f "
               "units_per_ms=%.1f\n",
               n, iterations, region, iterations * (linear_units + quadratic_units),
               work_cpu_ns * 1e-9, per_ms);
    MPI_Finalize();
    return 0;
}

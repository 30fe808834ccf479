/*
 * escape.c - MPI calls that never return: an error handler leaves them with longjmp.
 *
 * The communicator's error handler jumps back out of the failing call (MPI_Send to a rank that
 * does not exist, made from a function below main), so the probes see the entry of a call whose
 * return never comes. Every later call must still count, and its bursts still be seen.
 *
 * Usage: escape OUTDIR [ESCAPES=20] [BURSTS=50]
 * Writes OUTDIR/escape.RANK.json: {"rank","pid","bursts":[[start_ns,cpu_ns],...]}, the bursts
 * between MPI_Barrier calls on MPI_COMM_SELF made after the escapes.
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include "clock.h"
#include "output.h"

static jmp_buf out_of_mpi;

static void leave(MPI_Comm *comm, int *code, ...)
{
    (void)comm;
    (void)code;
    longjmp(out_of_mpi, 1);
}

/* MPI_Send to `rank`, from a frame of its own below main's, as a library routine would call it:
 * the calls main makes after the jump come from a frame above the one left. */
static __attribute__((noinline)) void send_nowhere(int rank)
{
    volatile int value = 0;
    MPI_Send((const void *)&value, 1, MPI_INT, rank, 0, MPI_COMM_WORLD);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc < 2) {
        if (rank == 0)
            fprintf(stderr, "usage: %s OUTDIR [ESCAPES] [BURSTS]\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int escapes = argc > 2 ? atoi(argv[2]) : 20;
    int n = argc > 3 ? atoi(argv[3]) : 50;
    long long (*bursts)[2] = malloc((size_t)n * sizeof *bursts);

    MPI_Errhandler handler;
    MPI_Comm_create_errhandler(leave, &handler);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, handler);
    int left = 0;
    for (int i = 0; i < escapes; i++) {
        if (setjmp(out_of_mpi) == 0)
            send_nowhere(size + 1);
        else
            left++;
    }
    if (left != escapes) {
        fprintf(stderr, "escape: %d of %d sends reached the error handler\n", left, escapes);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);

    MPI_Barrier(MPI_COMM_SELF);
    for (int i = 0; i < n; i++) {
        long long start = now_ns(), cpu0 = thread_cpu_ns();
        spin_cpu(1e-3);
        bursts[i][0] = start;
        bursts[i][1] = thread_cpu_ns() - cpu0;
        MPI_Barrier(MPI_COMM_SELF);
    }

    MPI_Finalize();
    return write_bursts(argv[1], "escape", rank, &bursts[0][0], n, 2);
}

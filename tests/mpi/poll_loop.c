/*
 * poll_loop: one rank polls a pending receive with MPI_Test while its peer computes, for
 * `cargo xtask bench apps`.
 *
 * Usage: poll_loop [ROUNDS=100] [WORK_MS=3]   (2 ranks)
 *
 * Each round, rank 0 posts an MPI_Irecv and calls MPI_Test in a loop until the message is there,
 * while rank 1 computes WORK_MS milliseconds of its own CPU time (calibrated on rank 1, see
 * work.h) and then sends the round's result. The loop is the polling pattern of codes that
 * progress communication by hand; each MPI_Test call is short, so a per-call cost of a profiler
 * shows up here first.
 *
 * Rank 0 prints one line: "poll_loop: checksum C, R iterations, timed T s, P MPI_Test calls",
 * C being the sum of the received results (so the work cannot be optimised away) and T the wall
 * time of the rounds between two barriers.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "work.h"

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int rounds = argc > 1 ? atoi(argv[1]) : 100;
    double work_ms = argc > 2 ? atof(argv[2]) : 3.0;
    if (size != 2 || rounds < 1 || work_ms < 0.0) {
        if (rank == 0)
            fprintf(stderr, "usage: poll_loop [ROUNDS >= 1] [WORK_MS >= 0] with 2 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    long units = rank == 1 ? (long)(work_ms * work_units_per_ms()) : 0;

    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    double checksum = 0.0;
    long long polls = 0;
    for (int round = 0; round < rounds; round++) {
        double result;
        if (rank == 0) {
            MPI_Request request;
            MPI_Irecv(&result, 1, MPI_DOUBLE, 1, round, MPI_COMM_WORLD, &request);
            int arrived = 0;
            while (!arrived) {
                MPI_Test(&request, &arrived, MPI_STATUS_IGNORE);
                polls++;
            }
            checksum += result;
        } else {
            work(units);
            result = work_sink + round;
            MPI_Send(&result, 1, MPI_DOUBLE, 0, round, MPI_COMM_WORLD);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double timed = MPI_Wtime() - start;
    if (rank == 0)
        printf("poll_loop: checksum %.17g, %d iterations, timed %.6f s, %lld MPI_Test calls\n", checksum, rounds,
               timed, polls);
    MPI_Finalize();
    return 0;
}

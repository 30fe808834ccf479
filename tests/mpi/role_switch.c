/*
 * role_switch: ranks that swap roles half-way, for the rank-group tests.
 *
 * Usage: role_switch OUTDIR [SECONDS=7] [WORK_MS=2]
 *
 * Ranks pair up (0 with 1, 2 with 3, …; an even count of ranks). For the first SECONDS the even
 * rank of each pair sends 1 KiB to the odd one each iteration (MPI_Send / MPI_Recv), then for
 * SECONDS more the odd rank sends to the even one. Each iteration works WORK_MS milliseconds of
 * on-CPU time and ends with an MPI_Allreduce of the elapsed time, so all ranks switch in the
 * same iteration. Each rank writes OUTDIR/role_switch.RANK.json with, in CLOCK_REALTIME ns, the
 * return of its last call of the old role and the return of its first call of the new one.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "clock.h"

static long long unix_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc < 2 || size % 2 != 0) {
        if (rank == 0)
            fprintf(stderr, "usage: role_switch OUTDIR [SECONDS] [WORK_MS] on an even number of ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    double seconds = argc > 2 ? atof(argv[2]) : 7.0;
    double work_s = (argc > 3 ? atof(argv[3]) : 2.0) * 1e-3;
    int partner = rank ^ 1;
    char message[1024] = {0};
    long long last_old = 0, first_new = 0;
    double start = now_s(), elapsed = 0.0;
    int switched = 0;
    while (elapsed < 2 * seconds) {
        spin_cpu(work_s);
        /* Before the switch the even rank sends; after it the odd one. */
        int sends = (rank % 2 == 0) != switched;
        if (sends)
            MPI_Send(message, sizeof message, MPI_CHAR, partner, 0, MPI_COMM_WORLD);
        else
            MPI_Recv(message, sizeof message, MPI_CHAR, partner, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (switched && first_new == 0)
            first_new = unix_ns();
        else if (!switched)
            last_old = unix_ns();
        double mine = now_s() - start;
        MPI_Allreduce(&mine, &elapsed, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        switched = elapsed >= seconds;
    }
    MPI_Finalize();
    char path[4096];
    snprintf(path, sizeof path, "%s/role_switch.%d.json", argv[1], rank);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        return 1;
    }
    fprintf(f, "{\"rank\":%d,\"last_old_ns\":%lld,\"first_new_ns\":%lld}\n", rank, last_old, first_new);
    return fclose(f) == 0 ? 0 : 1;
}

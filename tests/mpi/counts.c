/*
 * counts.c - ground truth for the profiler's per-function call and byte counts.
 *
 * Every probed MPI call this program makes is mirrored in its own counters, so a
 * test can compare the daemon's totals with what the rank says it did.  Several
 * counts depend on the rank (10 + 3*rank), so an off-by-one or a mix-up between
 * processes cannot pass by accident.  Some calls use the PMPI_ names directly:
 * they are the same function (MPI_X is a weak alias of PMPI_X) and must count
 * under the MPI_ name.
 *
 * bytes = count argument * size of its datatype, for the first (count, datatype)
 * pair of the C signature.
 *
 * Usage: counts OUTDIR      writes OUTDIR/counts.<rank>.json after MPI_Finalize.
 * Needs at least 2 ranks.
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

enum {
    F_INIT, F_FINALIZE, F_SEND, F_RECV, F_SENDRECV, F_ISEND, F_IRECV, F_WAIT,
    F_WAITALL, F_TEST, F_IPROBE, F_BARRIER, F_BCAST, F_REDUCE, F_ALLREDUCE,
    F_ALLTOALL, F_TYPE_FREE, NFUNC
};
static const char *const names[NFUNC] = {
    "MPI_Init", "MPI_Finalize", "MPI_Send", "MPI_Recv", "MPI_Sendrecv",
    "MPI_Isend", "MPI_Irecv", "MPI_Wait", "MPI_Waitall", "MPI_Test",
    "MPI_Iprobe", "MPI_Barrier", "MPI_Bcast", "MPI_Reduce", "MPI_Allreduce",
    "MPI_Alltoall", "MPI_Type_free",
};
static long long calls[NFUNC], bytes[NFUNC];

/* Record one call.  count == 0 means "no (count, datatype) argument", which
 * also covers MPI_Init, where MPI_Type_size may not be called yet. */
static void note(int f, int count, MPI_Datatype type)
{
    calls[f]++;
    if (count > 0) {
        int size;
        MPI_Type_size(type, &size); /* not probed, so it does not disturb the counts */
        bytes[f] += (long long)count * size;
    }
}

static void sleep_us(long us)
{
    struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };
    nanosleep(&ts, NULL);
}

int main(int argc, char **argv)
{
    int rank, size;

    MPI_Init(&argc, &argv);
    note(F_INIT, 0, MPI_DATATYPE_NULL);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc < 2 || size < 2) {
        if (rank == 0)
            fprintf(stderr, "usage: mpirun -np N>=2 %s OUTDIR\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const int left = (rank + size - 1) % size, right = (rank + 1) % size;
    /* Buffers for every call below: the fan-in sends up to size ints, the
     * alltoall 2 per rank, the fixed counts are <= 16. */
    const size_t len = 2 * (size_t)size + 16;
    int *ibuf = calloc(len, sizeof *ibuf), *ibuf2 = calloc(len, sizeof *ibuf2);
    double *dbuf = calloc(len, sizeof *dbuf), *dbuf2 = calloc(len, sizeof *dbuf2);
    MPI_Request req[2];
    /* Real status arrays rather than MPI_STATUSES_IGNORE: with MPICH's headers
     * gcc 12 warns (-Wstringop-overflow) about the latter. */
    MPI_Status sts[2];

    /* Fan-in: rank r > 0 sends 10 + 3r messages of r + 1 ints to rank 0,
     * alternating MPI_Send and PMPI_Send.  Rank 0 discovers them with an
     * MPI_Iprobe polling loop, so its Iprobe count varies from run to run:
     * that is fine, since what matters is that every call is counted here. */
    if (rank > 0) {
        for (int i = 0; i < 10 + 3 * rank; i++) {
            if (i % 2)
                PMPI_Send(ibuf, rank + 1, MPI_INT, 0, 1, MPI_COMM_WORLD);
            else
                MPI_Send(ibuf, rank + 1, MPI_INT, 0, 1, MPI_COMM_WORLD);
            note(F_SEND, rank + 1, MPI_INT);
        }
    } else {
        int expected = 0;
        for (int r = 1; r < size; r++)
            expected += 10 + 3 * r;
        for (int m = 0; m < expected; m++) {
            int flag, n;
            MPI_Status st;
            for (;;) {
                MPI_Iprobe(MPI_ANY_SOURCE, 1, MPI_COMM_WORLD, &flag, &st);
                note(F_IPROBE, 0, MPI_DATATYPE_NULL);
                if (flag)
                    break;
                /* Back off so that an oversubscribed sender gets the CPU and the
                 * Iprobe count stays in the hundreds, not the hundreds of thousands. */
                sleep_us(50);
            }
            MPI_Get_count(&st, MPI_INT, &n);
            MPI_Recv(ibuf2, n, MPI_INT, st.MPI_SOURCE, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            note(F_RECV, n, MPI_INT);
        }
    }

    /* Ring shift with MPI_Sendrecv: 5 calls of 8 doubles on every rank. */
    for (int i = 0; i < 5; i++) {
        MPI_Sendrecv(dbuf, 8, MPI_DOUBLE, right, 2, dbuf2, 8, MPI_DOUBLE, left, 2,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        note(F_SENDRECV, 8, MPI_DOUBLE);
    }

    /* Derived datatypes made, used and freed in turn, each of another size: the allocator
     * hands a freed datatype's address to the next one, so a profiler that remembered a
     * datatype's size by its handle across MPI_Type_free would count the old size. Open MPI
     * only: with MPICH only builtin datatypes have their bytes counted (their handles encode
     * the size). */
#ifdef OPEN_MPI
    for (int i = 0; i < 6; i++) {
        MPI_Datatype run;
        MPI_Type_contiguous(i % 3 + 1, MPI_INT, &run);
        MPI_Type_commit(&run);
        MPI_Sendrecv(ibuf, 2, run, right, 5, ibuf2, 2, run, left, 5, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        note(F_SENDRECV, 2, run);
        MPI_Type_free(&run);
        note(F_TYPE_FREE, 0, MPI_DATATYPE_NULL);
    }
#endif

    /* Nonblocking ring: 7 rounds completed with MPI_Waitall, then 4 completed
     * request by request with MPI_Wait. */
    for (int i = 0; i < 11; i++) {
        MPI_Irecv(ibuf2, 16, MPI_INT, left, 3, MPI_COMM_WORLD, &req[0]);
        note(F_IRECV, 16, MPI_INT);
        MPI_Isend(ibuf, 16, MPI_INT, right, 3, MPI_COMM_WORLD, &req[1]);
        note(F_ISEND, 16, MPI_INT);
        if (i < 7) {
            MPI_Waitall(2, req, sts);
            note(F_WAITALL, 0, MPI_DATATYPE_NULL);
        } else {
            for (int k = 0; k < 2; k++) {
                MPI_Wait(&req[k], MPI_STATUS_IGNORE);
                note(F_WAIT, 0, MPI_DATATYPE_NULL);
            }
        }
    }

    /* MPI_Test on a request that is certainly pending for a while: after a
     * common barrier, in each pair (2k, 2k+1) the odd rank sends only after
     * sleeping 2 ms, and the even rank polls every 200 us.  Without the barrier
     * a late even rank would find the message already there.  An odd size
     * leaves the last rank out. */
    MPI_Barrier(MPI_COMM_WORLD);
    note(F_BARRIER, 0, MPI_DATATYPE_NULL);
    if (rank % 2 == 0 && rank + 1 < size) {
        int done = 0;
        MPI_Irecv(ibuf2, 4, MPI_INT, rank + 1, 4, MPI_COMM_WORLD, &req[0]);
        note(F_IRECV, 4, MPI_INT);
        while (!done) {
            sleep_us(200);
            MPI_Test(&req[0], &done, MPI_STATUS_IGNORE);
            note(F_TEST, 0, MPI_DATATYPE_NULL);
        }
    } else if (rank % 2 == 1) {
        sleep_us(2000);
        MPI_Send(ibuf, 4, MPI_INT, rank - 1, 4, MPI_COMM_WORLD);
        note(F_SEND, 4, MPI_INT);
    }

    /* Collectives on MPI_COMM_SELF can be called a rank-dependent number of
     * times: 10 + 3*rank barriers (every third through PMPI_Barrier) and
     * rank + 1 broadcasts of rank + 1 doubles. */
    for (int i = 0; i < 10 + 3 * rank; i++) {
        if (i % 3 == 0)
            PMPI_Barrier(MPI_COMM_SELF);
        else
            MPI_Barrier(MPI_COMM_SELF);
        note(F_BARRIER, 0, MPI_DATATYPE_NULL);
    }
    for (int i = 0; i <= rank; i++) {
        MPI_Bcast(dbuf, rank + 1, MPI_DOUBLE, 0, MPI_COMM_SELF);
        note(F_BCAST, rank + 1, MPI_DOUBLE);
    }

    /* Collectives on MPI_COMM_WORLD: the same number on every rank. */
    for (int i = 0; i < 4; i++) {
        MPI_Bcast(dbuf, 16, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        note(F_BCAST, 16, MPI_DOUBLE);
    }
    for (int i = 0; i < 6; i++) {
        ibuf[0] = rank + i;
        if (i % 2)
            PMPI_Allreduce(ibuf, ibuf2, 3, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        else
            MPI_Allreduce(ibuf, ibuf2, 3, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        note(F_ALLREDUCE, 3, MPI_INT);
    }
    for (int i = 0; i < 4; i++) {
        MPI_Reduce(dbuf, dbuf2, 2, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        note(F_REDUCE, 2, MPI_DOUBLE);
    }
    for (int i = 0; i < 3; i++) {
        MPI_Alltoall(ibuf, 2, MPI_INT, ibuf2, 2, MPI_INT, MPI_COMM_WORLD);
        note(F_ALLTOALL, 2, MPI_INT);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    note(F_BARRIER, 0, MPI_DATATYPE_NULL);
    PMPI_Barrier(MPI_COMM_WORLD);
    note(F_BARRIER, 0, MPI_DATATYPE_NULL);

    /* A real job outlives the profiler's discovery interval (0.1 s); this one would not. */
    nanosleep(&(struct timespec){.tv_sec = 0, .tv_nsec = 400000000}, NULL);
    MPI_Finalize();
    note(F_FINALIZE, 0, MPI_DATATYPE_NULL);

    /* One JSON line, written after MPI_Finalize so that it is counted too. */
    char path[4096];
    snprintf(path, sizeof path, "%s/counts.%d.json", argv[1], rank);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        return 1;
    }
    fprintf(f, "{\"rank\":%d,\"size\":%d,\"pid\":%ld,\"calls\":{", rank, size, (long)getpid());
    const char *sep = "";
    for (int i = 0; i < NFUNC; i++)
        if (calls[i] > 0) {
            fprintf(f, "%s\"%s\":%lld", sep, names[i], calls[i]);
            sep = ",";
        }
    fprintf(f, "},\"bytes\":{");
    sep = "";
    for (int i = 0; i < NFUNC; i++)
        if (bytes[i] > 0) {
            fprintf(f, "%s\"%s\":%lld", sep, names[i], bytes[i]);
            sep = ",";
        }
    fprintf(f, "}}\n");
    return fclose(f) == 0 ? 0 : 1;
}

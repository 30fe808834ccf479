/*
 * interposer.c - a PMPI interposer, as tracing and checking tools build them:
 * a shared library, preloaded with LD_PRELOAD, that defines the MPI functions
 * the counts program calls and forwards each to its PMPI_ version in the MPI
 * library.  It counts the calls it forwards in `interposed_calls`, so that the
 * forwarding is real code and not folded into a tail jump.  Built with
 * -DTAIL_CALLS (interposer_tail.<mpi>) it only forwards, `return PMPI_X(...)`,
 * which the compiler turns into a jump: the PMPI function then runs with the
 * stack pointer and the return address of the application's call.
 *
 * Built by build.sh as interposer.<mpi>.  With it preloaded, the
 * profiler must still count each call once, and find its call site in the
 * application, not in this library.
 */
#include <mpi.h>

long long interposed_calls;

#ifdef TAIL_CALLS
#define FORWARD(call) return (call)
#else
#define FORWARD(call)        \
    do {                     \
        int rc_ = (call);    \
        interposed_calls++;  \
        return rc_;          \
    } while (0)
#endif

int MPI_Init(int *argc, char ***argv) { FORWARD(PMPI_Init(argc, argv)); }
int MPI_Finalize(void) { FORWARD(PMPI_Finalize()); }

int MPI_Send(const void *buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm)
{
    FORWARD(PMPI_Send(buf, count, type, dest, tag, comm));
}

int MPI_Recv(void *buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm,
             MPI_Status *status)
{
    FORWARD(PMPI_Recv(buf, count, type, source, tag, comm, status));
}

int MPI_Sendrecv(const void *sbuf, int scount, MPI_Datatype stype, int dest, int stag,
                 void *rbuf, int rcount, MPI_Datatype rtype, int source, int rtag,
                 MPI_Comm comm, MPI_Status *status)
{
    FORWARD(PMPI_Sendrecv(sbuf, scount, stype, dest, stag, rbuf, rcount, rtype, source, rtag,
                          comm, status));
}

int MPI_Isend(const void *buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm,
              MPI_Request *req)
{
    FORWARD(PMPI_Isend(buf, count, type, dest, tag, comm, req));
}

int MPI_Irecv(void *buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm,
              MPI_Request *req)
{
    FORWARD(PMPI_Irecv(buf, count, type, source, tag, comm, req));
}

int MPI_Wait(MPI_Request *req, MPI_Status *status) { FORWARD(PMPI_Wait(req, status)); }

int MPI_Waitall(int n, MPI_Request reqs[], MPI_Status statuses[])
{
    FORWARD(PMPI_Waitall(n, reqs, statuses));
}

int MPI_Test(MPI_Request *req, int *flag, MPI_Status *status)
{
    FORWARD(PMPI_Test(req, flag, status));
}

int MPI_Iprobe(int source, int tag, MPI_Comm comm, int *flag, MPI_Status *status)
{
    FORWARD(PMPI_Iprobe(source, tag, comm, flag, status));
}

int MPI_Barrier(MPI_Comm comm) { FORWARD(PMPI_Barrier(comm)); }

int MPI_Bcast(void *buf, int count, MPI_Datatype type, int root, MPI_Comm comm)
{
    FORWARD(PMPI_Bcast(buf, count, type, root, comm));
}

int MPI_Reduce(const void *sbuf, void *rbuf, int count, MPI_Datatype type, MPI_Op op, int root,
               MPI_Comm comm)
{
    FORWARD(PMPI_Reduce(sbuf, rbuf, count, type, op, root, comm));
}

int MPI_Allreduce(const void *sbuf, void *rbuf, int count, MPI_Datatype type, MPI_Op op,
                  MPI_Comm comm)
{
    FORWARD(PMPI_Allreduce(sbuf, rbuf, count, type, op, comm));
}

int MPI_Alltoall(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, int rcount,
                 MPI_Datatype rtype, MPI_Comm comm)
{
    FORWARD(PMPI_Alltoall(sbuf, scount, stype, rbuf, rcount, rtype, comm));
}

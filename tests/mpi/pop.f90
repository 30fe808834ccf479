! pop.f90 - the "imbalance" mode of pop.c from Fortran: even ranks spin 20 ms, odd ranks 40 ms,
! then MPI_BARRIER; with 2 ranks LB = 0.75 and CommE ~ 1. The program's own account of its region
! of interest (return of MPI_INIT to entry of MPI_FINALIZE) and of its time inside MPI calls,
! from MPI_WTIME around the calls, is the ground truth.
!
! Usage: pop_f90 ITERATIONS OUTDIR    Writes OUTDIR/pop.RANK.json like pop.c.
program pop
    use mpi
    implicit none
    integer :: ierr, rank, iters, i, unit
    double precision :: region_start, region_end, mpi_s, t0, work
    character(len=4096) :: arg, outdir, path

    call MPI_INIT(ierr)
    region_start = MPI_WTIME()
    call MPI_COMM_RANK(MPI_COMM_WORLD, rank, ierr)
    call get_command_argument(1, arg)
    read (arg, *) iters
    call get_command_argument(2, outdir)
    work = 0.020d0
    if (mod(rank, 2) == 1) work = 0.040d0
    mpi_s = 0
    do i = 1, iters
        t0 = MPI_WTIME()
        do while (MPI_WTIME() - t0 < work)
        end do
        t0 = MPI_WTIME()
        call MPI_BARRIER(MPI_COMM_WORLD, ierr)
        mpi_s = mpi_s + (MPI_WTIME() - t0)
    end do
    region_end = MPI_WTIME()
    call MPI_FINALIZE(ierr)

    write (path, '(A,A,I0,A)') trim(outdir), '/pop.', rank, '.json'
    open (newunit=unit, file=trim(path), status='replace', action='write')
    write (unit, '(A,I0,A,ES17.9,A,ES17.9,A)') '{"rank":', rank, ',"region_s":', region_end - region_start, &
        ',"mpi_s":', mpi_s, '}'
    close (unit)
end program pop

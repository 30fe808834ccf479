! counts.f90 - Fortran twin of counts.c: ground truth for call and byte counts
! when the calls go through the MPI library's Fortran bindings.
!
! Every probed MPI call is mirrored in the program's own counters; several
! counts depend on the rank (10 + 3*rank).  Some calls use the PMPI_ names
! directly and must count under the MPI_ name.  Fortran bindings end up in the
! C library, so each call here must count exactly once, not once per layer.
!
! bytes = count argument * size of its datatype (first count/datatype pair of
! the C signature).
!
! Usage: counts OUTDIR    writes OUTDIR/counts.<rank>.json after MPI_Finalize.
! Needs at least 2 ranks.
program counts
  use mpi
  implicit none

  integer, parameter :: nfunc = 11
  integer, parameter :: f_init = 1, f_finalize = 2, f_send = 3, f_recv = 4, &
       f_isend = 5, f_irecv = 6, f_waitall = 7, f_barrier = 8, f_bcast = 9, &
       f_reduce = 10, f_allreduce = 11
  character(len=13), parameter :: names(nfunc) = [character(len=13) :: &
       'MPI_Init', 'MPI_Finalize', 'MPI_Send', 'MPI_Recv', 'MPI_Isend', &
       'MPI_Irecv', 'MPI_Waitall', 'MPI_Barrier', 'MPI_Bcast', 'MPI_Reduce', &
       'MPI_Allreduce']
  integer(8) :: calls(nfunc) = 0, bytes(nfunc) = 0

  integer :: ierr, rank, nranks, left, right, i, r, u, ios
  integer :: req(2)
  ! Some counts grow with the rank (up to nranks), the fixed ones are <= 8.
  integer, allocatable :: ibuf(:), ibuf2(:)
  double precision, allocatable :: dbuf(:), dbuf2(:)
  character(len=4096) :: outdir, path
  character(len=4096) :: line

  call MPI_Init(ierr)
  call note(f_init, 0, MPI_DATATYPE_NULL)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks, ierr)
  if (command_argument_count() < 1 .or. nranks < 2) then
     if (rank == 0) write (0, '(a)') 'usage: mpirun -np N>=2 counts OUTDIR'
     call MPI_Abort(MPI_COMM_WORLD, 2, ierr)
  end if
  call get_command_argument(1, outdir)
  allocate (ibuf(nranks + 8), ibuf2(nranks + 8), dbuf(8), dbuf2(8))
  ibuf = 0
  dbuf = 0d0
  left = mod(rank + nranks - 1, nranks)
  right = mod(rank + 1, nranks)

  ! Fan-in: rank r > 0 sends 10 + 3r messages of r + 1 integers to rank 0,
  ! alternating MPI_Send and PMPI_Send; rank 0 receives them source by source
  ! (small messages go eagerly, so the senders never wait for the order).
  if (rank > 0) then
     do i = 1, 10 + 3 * rank
        if (mod(i, 2) == 0) then
           call PMPI_Send(ibuf, rank + 1, MPI_INTEGER, 0, 1, MPI_COMM_WORLD, ierr)
        else
           call MPI_Send(ibuf, rank + 1, MPI_INTEGER, 0, 1, MPI_COMM_WORLD, ierr)
        end if
        call note(f_send, rank + 1, MPI_INTEGER)
     end do
  else
     do r = 1, nranks - 1
        do i = 1, 10 + 3 * r
           call MPI_Recv(ibuf2, r + 1, MPI_INTEGER, r, 1, MPI_COMM_WORLD, &
                MPI_STATUS_IGNORE, ierr)
           call note(f_recv, r + 1, MPI_INTEGER)
        end do
     end do
  end if

  ! Nonblocking ring: 6 rounds of Irecv + Isend completed by MPI_Waitall.
  do i = 1, 6
     call MPI_Irecv(dbuf2, 8, MPI_DOUBLE_PRECISION, left, 2, MPI_COMM_WORLD, req(1), ierr)
     call note(f_irecv, 8, MPI_DOUBLE_PRECISION)
     call MPI_Isend(dbuf, 8, MPI_DOUBLE_PRECISION, right, 2, MPI_COMM_WORLD, req(2), ierr)
     call note(f_isend, 8, MPI_DOUBLE_PRECISION)
     call MPI_Waitall(2, req, MPI_STATUSES_IGNORE, ierr)
     call note(f_waitall, 0, MPI_DATATYPE_NULL)
  end do

  ! Barriers on MPI_COMM_SELF can be rank-dependent: 10 + 3*rank of them,
  ! every third one through PMPI_Barrier.
  do i = 1, 10 + 3 * rank
     if (mod(i, 3) == 0) then
        call PMPI_Barrier(MPI_COMM_SELF, ierr)
     else
        call MPI_Barrier(MPI_COMM_SELF, ierr)
     end if
     call note(f_barrier, 0, MPI_DATATYPE_NULL)
  end do

  ! Collectives on MPI_COMM_WORLD, the same number on every rank.
  do i = 1, 3
     call MPI_Bcast(dbuf, 8, MPI_DOUBLE_PRECISION, 0, MPI_COMM_WORLD, ierr)
     call note(f_bcast, 8, MPI_DOUBLE_PRECISION)
  end do
  do i = 1, 4
     ibuf(1) = rank + i
     if (mod(i, 2) == 0) then
        call PMPI_Allreduce(ibuf, ibuf2, 5, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
     else
        call MPI_Allreduce(ibuf, ibuf2, 5, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
     end if
     call note(f_allreduce, 5, MPI_INTEGER)
  end do
  do i = 1, 2
     call MPI_Reduce(dbuf, dbuf2, 3, MPI_DOUBLE_PRECISION, MPI_MAX, 0, MPI_COMM_WORLD, ierr)
     call note(f_reduce, 3, MPI_DOUBLE_PRECISION)
  end do
  call PMPI_Barrier(MPI_COMM_WORLD, ierr)
  call note(f_barrier, 0, MPI_DATATYPE_NULL)

  ! A real job outlives the profiler's discovery interval (0.1 s); this one would not.
  call sleep(1)
  call MPI_Finalize(ierr)
  call note(f_finalize, 0, MPI_DATATYPE_NULL)

  ! One JSON line, written after MPI_Finalize so that it is counted too.
  write (line, '(a,i0,a,i0,a,i0,a)') '{"rank":', rank, ',"size":', nranks, &
       ',"pid":', getpid(), ',"calls":{'
  call append_map(calls)
  line = trim(line) // '},"bytes":{'
  call append_map(bytes)
  line = trim(line) // '}}'
  write (path, '(a,a,i0,a)') trim(outdir), '/counts.', rank, '.json'
  open (newunit=u, file=trim(path), status='replace', action='write', iostat=ios)
  if (ios /= 0) then
     write (0, '(a,a)') 'cannot write ', trim(path)
     stop 1
  end if
  write (u, '(a)') trim(line)
  close (u)

contains

  ! Record one call; count == 0 means "no (count, datatype) argument", which
  ! also covers MPI_Init, where MPI_Type_size may not be called yet.
  subroutine note(f, count, datatype)
    integer, intent(in) :: f, count, datatype
    integer :: tsize, err
    calls(f) = calls(f) + 1
    if (count > 0) then
       call MPI_Type_size(datatype, tsize, err)   ! not probed: does not disturb the counts
       bytes(f) = bytes(f) + int(count, 8) * tsize
    end if
  end subroutine note

  ! Append "name":value pairs for the non-zero entries of v to line.
  subroutine append_map(v)
    integer(8), intent(in) :: v(nfunc)
    character(len=32) :: num
    logical :: first
    integer :: k
    first = .true.
    do k = 1, nfunc
       if (v(k) > 0) then
          write (num, '(i0)') v(k)
          if (.not. first) line = trim(line) // ','
          line = trim(line) // '"' // trim(names(k)) // '":' // trim(num)
          first = .false.
       end if
    end do
  end subroutine append_map

end program counts

! call_loop.f90 - Fortran twin of call_loop.c for one function: the cost of one probed MPI call
! made through the MPI library's Fortran bindings, whose wrapper calls the C function (two
! probed functions per call, the C one nested in the wrapper).
!
! Usage: call_loop [N=1000000]   N calls of MPI_Barrier on MPI_COMM_SELF after a warm-up of
! 10000; prints one line to stdout: {"function":"barrier_f90","calls":N,"ns_per_call":X}
program call_loop
  use mpi
  implicit none
  integer :: ierr, i
  integer(8) :: n, t0, t1, rate
  character(len=32) :: arg

  call MPI_Init(ierr)
  n = 1000000
  if (command_argument_count() >= 1) then
     call get_command_argument(1, arg)
     read (arg, *) n
  end if
  do i = 1, 10000
     call MPI_Barrier(MPI_COMM_SELF, ierr)
  end do
  call system_clock(t0, rate)
  do i = 1, int(n)
     call MPI_Barrier(MPI_COMM_SELF, ierr)
  end do
  call system_clock(t1)
  write (*, '(a,i0,a,f0.2,a)') '{"function":"barrier_f90","calls":', n, ',"ns_per_call":', &
       real(t1 - t0, 8) * 1.0d9 / real(rate, 8) / real(max(n, 1_8), 8), '}'
  call MPI_Finalize(ierr)
end program call_loop

/* Bare MPI_Allreduce timing, the peer of `loom bench comm --backend mpi --ops all_reduce`.
 * Same sizes (powers of two from min to max bytes of f32, in place), same timing rule: warm-up
 * iterations, a barrier, then the mean of the timed iterations, the slowest rank's reported,
 * with nccl-tests' bandwidths (algbw = size / time, busbw = algbw * 2(n-1)/n).
 * Usage: mpirun -np N mpi_allreduce_peer [min_bytes] [max_bytes] [iters] [warmup] [single|multiple]
 *                                        [blocking|nonblocking]
 * The fifth argument picks the thread level asked of MPI_Init_thread: MPI_THREAD_SINGLE (the
 * default, what a bare program asks) or MPI_THREAD_MULTIPLE (what loom's mpi backend asks). The
 * sixth times MPI_Allreduce (default) or MPI_Iallreduce + MPI_Wait, the nonblocking form. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void all_reduce(float* buffer, int count, int nonblocking) {
  if (nonblocking) {
    MPI_Request request;
    MPI_Iallreduce(MPI_IN_PLACE, buffer, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &request);
    MPI_Wait(&request, MPI_STATUS_IGNORE);
  } else {
    MPI_Allreduce(MPI_IN_PLACE, buffer, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
}

int main(int argc, char** argv) {
  const int multiple = argc > 5 && strcmp(argv[5], "multiple") == 0;
  const int nonblocking = argc > 6 && strcmp(argv[6], "nonblocking") == 0;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, multiple ? MPI_THREAD_MULTIPLE : MPI_THREAD_SINGLE, &provided);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const long long min_bytes = argc > 1 ? atoll(argv[1]) : 8;
  const long long max_bytes = argc > 2 ? atoll(argv[2]) : 256LL << 20;
  const int iters = argc > 3 ? atoi(argv[3]) : 20;
  const int warmup = argc > 4 ? atoi(argv[4]) : 5;
  if (min_bytes < 4 || max_bytes < min_bytes || iters < 1 || warmup < 0) {
    if (rank == 0) {
      fprintf(stderr,
              "usage: mpi_allreduce_peer [min_bytes>=4] [max_bytes] [iters>=1] [warmup>=0] [single|multiple] "
              "[blocking|nonblocking]\n");
    }
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  float* buffer = malloc((size_t)max_bytes);
  if (buffer == NULL) MPI_Abort(MPI_COMM_WORLD, 3);
  memset(buffer, 0, (size_t)max_bytes); /* zeros: sums stay finite; pages touched before timing */
  if (rank == 0) {
    printf("# bare %s (MPI_FLOAT, MPI_SUM, in place): %d ranks, %d timed iterations after %d warm-up, "
           "thread level %s\n",
           nonblocking ? "MPI_Iallreduce + MPI_Wait" : "MPI_Allreduce", ranks, iters, warmup,
           provided == MPI_THREAD_MULTIPLE ? "MPI_THREAD_MULTIPLE" : "MPI_THREAD_SINGLE");
    printf("# op                  size        count     time(us)  algbw(GB/s)  busbw(GB/s)\n");
  }
  for (long long bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
    const int count = (int)(bytes / 4);
    for (int i = 0; i < warmup; ++i) all_reduce(buffer, count, nonblocking);
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    for (int i = 0; i < iters; ++i) all_reduce(buffer, count, nonblocking);
    double seconds = (MPI_Wtime() - start) / iters;
    MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) {
      const double size = (double)count * 4.0;
      const double algbw = size / seconds / 1e9;
      printf("%-15s %12lld %12d %12.2f %12.3f %12.3f\n", "all_reduce", (long long)count * 4, count, seconds * 1e6,
             algbw, algbw * 2.0 * (ranks - 1) / ranks);
      fflush(stdout);
    }
  }
  free(buffer);
  MPI_Finalize();
  return 0;
}

// ThreadSanitizer cannot see synchronization inside libraries that are not
// built with -fsanitize=thread: Debian's libtbb and libLLVM-19.
//
// libtbb: TBB's own task bookkeeping (code inlined from TBB headers into
// ours) looks racy: task objects recycled by TBB's small-object pool between
// threads, and the task tree's counters. Suppressed are only reports whose
// innermost frame is TBB's, where one side is constructing an object TBB's
// pool just handed out, or where one side is TBB folding up its task tree
// (fold_tree): a race in a body that TBB runs has that body as its innermost
// frame and is still reported. support/parallel.h adds the caller<->body
// edges TBB guarantees.
//
// libLLVM: ORC's reference-counted objects (resource trackers) are released
// by our code, inlined from LLVM headers, and freed by LLVM's own threads;
// the counter's ordering is invisible. Suppressed are reports with a frame
// in libLLVM itself.
//
// libopenblas: its pthread pool (started by blas_thread_init) takes work
// through OpenBLAS's own queue, which TSan cannot see: the output matrix a
// caller allocated and OpenBLAS's thread then writes (sgemm_beta clearing
// it) looks racy. Seen where OpenBLAS runs its threads (a SkylakeX kernel
// choice on 2 vCPUs). Suppressed are reports with a frame in libopenblas.
//
// Linked into every binary that uses TBB, LLVM or OpenBLAS; unused outside
// TSan builds.
extern "C" const char* __tsan_default_suppressions() {
  return "race_top:tbb::detail::\n"
         "race_top:/oneapi/tbb/\n"
         "race:tbb::detail::d1::small_object_allocator::new_object\n"
         "race:tbb::detail::d1::fold_tree\n"
         "race:libLLVM.so.19.1\n"
         "race:libopenblas.so.0\n";
}

// ThreadSanitizer cannot see the synchronization inside Debian's libtbb, which
// is not built with -fsanitize=thread, so it reports TBB's own task bookkeeping
// (code inlined from TBB headers into ours) as races: task objects recycled by
// TBB's small-object pool between threads, and the task tree's counters.
// Suppressed are only reports whose innermost frame is TBB's, where one side is
// constructing an object TBB's pool just handed out, or where one side is
// TBB folding up its task tree when a loop completes (fold_tree): a race in a
// body that TBB runs has that body as its innermost frame and is still
// reported. support/parallel.h adds the caller↔body edges TBB guarantees.
// Linked into every binary that uses TBB; unused outside TSan builds.
extern "C" const char* __tsan_default_suppressions() {
  return "race_top:tbb::detail::\n"
         "race_top:/oneapi/tbb/\n"
         "race:tbb::detail::d1::small_object_allocator::new_object\n"
         "race:tbb::detail::d1::fold_tree\n";
}

// Entry point only: the work happens in MountCommand, outside top-level code (closures created
// here would be bound to the main actor and crash on libfuse worker threads).
#if canImport(Glibc)
import Glibc
#endif
import CMount

// Two malloc arenas, unless MALLOC_ARENA_MAX says otherwise: the daemon's many threads (FUSE,
// the background pool) each took an arena of their own, and `ls -l` of 200 000 names peaked at
// 130 MiB against 111 MiB with two (issue 21; docs/decisions/0091-malloc-arenas.md).
if getenv("MALLOC_ARENA_MAX") == nil { _ = cssp_limit_malloc_arenas(2) }

exit(MountCommand.run(arguments: Array(CommandLine.arguments.dropFirst()), programName: CommandLine.arguments[0]))

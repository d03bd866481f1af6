// Entry point only: the work happens in MountCommand, outside top-level code (closures created
// here would be bound to the main actor and crash on libfuse worker threads).
#if canImport(Glibc)
import Glibc
#endif

exit(MountCommand.run(arguments: Array(CommandLine.arguments.dropFirst()), programName: CommandLine.arguments[0]))

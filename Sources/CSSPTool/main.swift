// cssp-tool: a small client for seeding, demos and benchmarks. Not installed; not part of the mount.
#if canImport(Glibc)
import Glibc
#endif

exit(Tool.run(Array(CommandLine.arguments.dropFirst())))

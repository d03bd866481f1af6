import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Waiting for a condition instead of sleeping: what the mount owes the server, and whether the
/// server holds a change yet.

/// Evaluates `condition` every `interval` microseconds until it holds (true) or `seconds` have
/// passed (false, after one last evaluation).
func poll(seconds: Double, interval: useconds_t = 50_000, until condition: () throws -> Bool) rethrows -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if try condition() { return true }
        usleep(interval)
    }
    return try condition()
}

extension Environment {
    /// Whether the mount at `directory` (spool below `cache`) owes the server nothing: no upload in
    /// progress or owed and no delete owed (`mount.cssp --status`), and no owed attribute change, whose note the man
    /// page's attr_write_delay says is journaled in the spool directory until it is stored
    /// (`--status` does not list those).
    func owesNothing(_ directory: String, cache: String) throws -> Bool {
        let status = try shell("\(quoted(binary)) --status \(quoted(directory))")
        guard status.status == 0 else { throw HarnessError("mount.cssp --status \(directory): \(status.stderr)") }
        guard status.stdout.contains("uploads in progress: 0\n"), status.stdout.contains("uploads owed: 0\n"),
            status.stdout.contains("deletes owed: 0\n")
        else {
            return false
        }
        let notes = try shell("find \(quoted(cache + "/spool")) -name '*.attributes' 2>/dev/null | head -1")
        return notes.stdout.isEmpty
    }

    /// Waits (at most `seconds`) until the mount owes nothing; false if it still does.
    func waitUntilNothingOwed(_ directory: String, cache: String, seconds: Double = 30) throws -> Bool {
        try poll(seconds: seconds) { try owesNothing(directory, cache: cache) }
    }
}

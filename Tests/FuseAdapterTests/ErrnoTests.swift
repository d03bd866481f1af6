import FileSystem
import FuseAdapter
import SystemPackage
import Testing

/// Pins the errno table that man/mount.cssp.8 publishes.
struct ErrnoTests {
    static let table: [(FSError.Code, Errno)] = [
        (.notFound, .noSuchFileOrDirectory),
        (.notADirectory, .notDirectory),
        (.isADirectory, .isDirectory),
        (.readOnly, .readOnlyFileSystem),
        (.notEmpty, .directoryNotEmpty),
        (.permissionDenied, .permissionDenied),
        (.stale, .staleNFSFileHandle),
        (.notSupported, .notSupported),
        (.invalidArgument, .invalidArgument),
        (.nameTooLong, .fileNameTooLong),
        (.notPermitted, .notPermitted),
        (.noSpace, .noSpace),
        (.exists, .fileExists),
        (.illegalByteSequence, .illegalByteSequence),
        (.ioError, .ioError),
    ]

    @Test func everyCodeHasItsPublishedErrno() {
        #expect(Self.table.count == FSError.Code.allCases.count)
        for (code, errno) in Self.table {
            #expect(Errno.forFilesystemError(code) == errno, "\(code)")
        }
    }
}

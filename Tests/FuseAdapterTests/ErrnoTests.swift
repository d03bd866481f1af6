import FileSystem
import FuseAdapter
import SystemPackage
import Testing

#if canImport(Glibc)
import Glibc
#endif

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
        (.badHandle, .badFileDescriptor),
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

    /// The names in log lines and `cssp_errors_total` are the names of the errnos sent.
    @Test func everyCodeNamesTheErrnoItBecomes() {
        let values: [String: Int32] = [
            "ENOENT": ENOENT, "ENOTDIR": ENOTDIR, "EISDIR": EISDIR, "EROFS": EROFS, "EBADF": EBADF, "ENOTEMPTY": ENOTEMPTY,
            "EACCES": EACCES, "ESTALE": ESTALE, "EOPNOTSUPP": EOPNOTSUPP, "EINVAL": EINVAL,
            "ENAMETOOLONG": ENAMETOOLONG, "EPERM": EPERM, "ENOSPC": ENOSPC, "EEXIST": EEXIST, "EILSEQ": EILSEQ,
            "EIO": EIO,
        ]
        for code in FSError.Code.allCases {
            #expect(values[code.errnoName] == Errno.forFilesystemError(code).rawValue, "\(code)")
        }
    }
}

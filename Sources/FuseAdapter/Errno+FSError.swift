import FileSystem
import SystemPackage

extension Errno {
    /// The one place where filesystem errors become errno values. No `default:`: a new code
    /// must be decided here. man/mount.cssp.8 publishes this table.
    public static func forFilesystemError(_ code: FSError.Code) -> Errno {
        switch code {
        case .notFound: return .noSuchFileOrDirectory
        case .notADirectory: return .notDirectory
        case .isADirectory: return .isDirectory
        case .readOnly: return .readOnlyFileSystem
        case .notEmpty: return .directoryNotEmpty
        // Refused credentials or a skewed clock: the caller may not access the data.
        case .permissionDenied: return .permissionDenied
        // The object changed under an open handle: NFS's answer for the same situation.
        case .stale: return .staleNFSFileHandle
        // A handle the kernel holds from a dead worker (issue 40): the descriptor is no more.
        case .badHandle: return .badFileDescriptor
        case .notSupported: return .notSupported
        case .invalidArgument: return .invalidArgument
        case .nameTooLong: return .fileNameTooLong
        // Hard links and special files: POSIX's answer for what a filesystem does not support.
        case .notPermitted: return .notPermitted
        // The spool (cache directory) is full: reported at write time, never as a lost close.
        case .noSpace: return .noSpace
        case .exists: return .fileExists
        // Object keys are UTF-8: a name that is not cannot be stored without aliasing another.
        case .illegalByteSequence: return .illegalByteSequence
        case .ioError: return .ioError
        }
    }
}

// swift-tools-version:6.0
// csspfs: mount a CSSP (OpenStack-Swift-based) object store container as a directory.
//
// Dependencies point downward only (ARCHITECTURE.md draws them):
//   MountCSSP -> FuseAdapter -> FileSystem -> FSNamespace, FSFiles -> FSJournal -> FSCore
//   FSCore -> ObjectStore, BlockCache, Metrics, Locking
//   MountCSSP -> ObjectStoreHTTP -> ObjectStore
// FuseAdapter is the only module that sees libfuse; ObjectStoreHTTP the only one that sees libcurl;
// MountCSSP the only one that sees libmount (/run/mount/utab, for umount(8)).
import PackageDescription

let package = Package(
    name: "csspfs",
    products: [
        .executable(name: "mount.cssp", targets: ["MountCSSP"]),
        .executable(name: "cssp-tool", targets: ["CSSPTool"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-system", from: "1.8.1"),
    ],
    targets: [
        .systemLibrary(name: "CFuse3", pkgConfig: "fuse3", providers: [.apt(["libfuse3-dev"])]),
        .systemLibrary(name: "CCurl", pkgConfig: "libcurl", providers: [.apt(["libcurl4-openssl-dev"])]),
        .systemLibrary(name: "CCrypto", pkgConfig: "libcrypto", providers: [.apt(["libssl-dev"])]),
        .systemLibrary(name: "CSQLite", pkgConfig: "sqlite3", providers: [.apt(["libsqlite3-dev"])]),
        .systemLibrary(name: "CMount", pkgConfig: "mount", providers: [.apt(["libmount-dev"])]),

        // `Locked`: the one lock type (a pthread mutex ThreadSanitizer understands).
        .target(name: "Locking"),
        // Counters, gauges and histograms of a mount, rendered for `mount.cssp --stats`.
        .target(name: "Metrics", dependencies: ["Locking"]),
        .target(
            name: "ObjectStore",
            dependencies: [.product(name: "Logging", package: "swift-log")]
        ),
        .target(
            name: "ObjectStoreHTTP",
            dependencies: [
                "ObjectStore", "CCurl", "CCrypto", "Metrics",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .target(name: "ObjectStoreTesting", dependencies: ["ObjectStore", "Locking"]),
        // What is on disk: the SQLite block cache (objects only as names, ETags and blocks) and the
        // metadata index (HEAD answers of other tools' objects).
        .target(
            name: "BlockCache",
            dependencies: ["CSQLite", "Locking", "ObjectStore", .product(name: "Logging", package: "swift-log")]
        ),
        // The vocabulary every room of the filesystem shares: errors, attributes, times, the
        // configuration, the background pool, the memory budget.
        .target(
            name: "FSCore",
            dependencies: [
                "ObjectStore", "BlockCache", "Locking", "Metrics", .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // What must survive the process: the spool directory, the upload and delete journals,
        // the delete queue, recovery of what an earlier mount owed, the store as the journal
        // shows it.
        .target(
            name: "FSJournal",
            dependencies: ["FSCore", "ObjectStore", "Locking", .product(name: "Logging", package: "swift-log")]
        ),
        // Which names exist with which attributes: the inode table, the directory cache, listings
        // and their readers, the collision rule, the attribute rule's merge.
        .target(
            name: "FSNamespace",
            dependencies: [
                "FSCore", "ObjectStore", "BlockCache", "Locking", .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // The bytes of files: spool files, the file reader and its read-ahead, the uploader and
        // early parts, transfers in progress, the kernel's page cache.
        .target(
            name: "FSFiles",
            dependencies: [
                "FSCore", "FSJournal", "ObjectStore", "BlockCache", "Locking", "Metrics",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        // The facade FuseAdapter calls: composes the rooms into the semantics of a mount.
        .target(
            name: "FileSystem",
            dependencies: [
                "FSCore", "FSJournal", "FSNamespace", "FSFiles",
                "ObjectStore", "BlockCache", "Locking", "Metrics",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        // The supervisor that holds /dev/fuse while workers come and go (issue 40): plain C.
        .target(name: "CSupervisor", dependencies: ["CFuse3"]),
        .target(
            name: "FuseAdapter",
            dependencies: [
                "FileSystem", "CFuse3", "CSupervisor", "Metrics",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        .executableTarget(
            name: "MountCSSP",
            dependencies: [
                "FuseAdapter", "FileSystem", "BlockCache", "ObjectStore", "ObjectStoreHTTP", "MountCSSPConfig", "CFuse3", "CMount",
                "Metrics",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // Developer tool for seeding, demos and benchmarks: talks to the store through the same client.
        .executableTarget(
            name: "CSSPTool",
            dependencies: ["ObjectStore", "ObjectStoreHTTP", "MountCSSPConfig"]
        ),
        // Option, URL and credential parsing, shared by mount.cssp and cssp-tool; pure, unit-tested.
        .target(name: "MountCSSPConfig", dependencies: ["ObjectStore"]),

        .testTarget(name: "ObjectStoreHTTPTests", dependencies: ["ObjectStoreHTTP", "ObjectStore", "ObjectStoreTesting"]),
        .testTarget(
            name: "BlockCacheTests",
            dependencies: ["BlockCache", "Locking", "ObjectStore", "ObjectStoreTesting", .product(name: "Logging", package: "swift-log")]
        ),
        .testTarget(
            name: "FileSystemTests",
            dependencies: [
                "FileSystem", "FSCore", "FSJournal", "FSNamespace", "FSFiles", "BlockCache", "ObjectStore", "ObjectStoreTesting", "Locking",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .testTarget(
            name: "FuseAdapterTests",
            dependencies: ["FuseAdapter", "FileSystem", .product(name: "SystemPackage", package: "swift-system")]
        ),
        .testTarget(name: "MountCSSPTests", dependencies: ["MountCSSPConfig"]),
        .testTarget(name: "MetricsTests", dependencies: ["Metrics"]),
        .testTarget(
            name: "EndToEndTests",
            dependencies: ["ObjectStore", "ObjectStoreHTTP", "ObjectStoreTesting", "MountCSSPConfig", "Locking"]
        ),
    ],
    swiftLanguageModes: [.v6]
)

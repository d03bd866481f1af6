import Foundation
import MountCSSPConfig
import Testing

struct ArgumentsTests {
    func options(_ arguments: [String]) throws -> MountOptions {
        guard case .mount(let options) = try Arguments.parse(arguments) else {
            throw ConfigurationError("not a mount command")
        }
        return options
    }

    @Test func mountHelperConvention() throws {
        let o = try options([
            "https://Store.Example:8443/photos", "/mnt/p", "-o", "rw,allow_other,uid=1000,gid=100,umask=027,_netdev",
            "-o", "passwd_file=/etc/pw,attr_timeout=2.5,nofail,x-systemd.automount,noatime", "-f", "-s", "-n", "-v",
        ])
        #expect(o.endpoint.baseURL == "https://store.example:8443")
        #expect(o.endpoint.container == "photos")
        #expect(o.mountpoint == "/mnt/p")
        #expect(o.allowOther && o.foreground && o.verbose && !o.debug && !o.readOnly)
        #expect(o.uid == 1000 && o.gid == 100 && o.umask == 0o027)
        #expect(o.passwdFile == "/etc/pw")
        #expect(o.attributeTimeout == 2.5)
        #expect(o.kernelFlags == ["noatime"])
    }

    @Test func flagsBeforePositionalsAndJoinedO() throws {
        let o = try options(["-d", "-oro,dir_timeout=0", "http://h/c/sub/dir/", "/m"])
        #expect(o.debug && o.foreground && o.readOnly)
        #expect(o.directoryTimeout == 0)
        #expect(o.endpoint.prefix == "sub/dir/")
        #expect(o.endpoint.url == "http://h/c/sub/dir")
    }

    @Test func cacheSizesTakeUnits() throws {
        #expect(try options(["http://h/c", "/m"]).cacheSize == nil)
        #expect(try options(["http://h/c", "/m", "-o", "cache_size=500"]).cacheSize == 500 << 20)
        #expect(try options(["http://h/c", "/m", "-o", "cache_size=4G"]).cacheSize == 4 << 30)
        #expect(try options(["http://h/c", "/m", "-o", "cache_size=64k"]).cacheSize == 64 << 10)
        #expect(try options(["http://h/c", "/m", "-o", "cache_size=0"]).cacheSize == 0)
        #expect(try options(["http://h/c", "/m", "-o", "cache_block_kb=256"]).cacheBlockKiB == 256)
        #expect(try options(["http://h/c", "/m"]).metadataPrefetch == 10_000)
        #expect(try options(["http://h/c", "/m", "-o", "meta_prefetch=0"]).metadataPrefetch == 0)
        #expect(try options(["http://h/c", "/m"]).listAhead == 8)
        #expect(try options(["http://h/c", "/m", "-o", "list_ahead=0"]).listAhead == 0)
    }

    @Test func exclusiveCreatesAreLocalUntilAsked() throws {
        #expect(try !options(["http://h/c", "/m"]).serverExclusiveCreates)
        #expect(try options(["http://h/c", "/m", "-o", "excl_create=server"]).serverExclusiveCreates)
        #expect(try !options(["http://h/c", "/m", "-o", "excl_create=server,excl_create=local"]).serverExclusiveCreates)
        for bad in ["excl_create=yes", "excl_create"] {
            #expect(throws: ConfigurationError.self) { try options(["http://h/c", "/m", "-o", bad]) }
        }
    }

    @Test func writeBackIsOffUntilAsked() throws {
        let plain = try options(["http://h/c", "/m"])
        #expect(!plain.writeBack && plain.writeBackDelay == 1)
        let o = try options(["http://h/c", "/m", "-o", "writeback,writeback_delay=0.5"])
        #expect(o.writeBack && o.writeBackDelay == 0.5)
        #expect(throws: ConfigurationError.self) { try options(["http://h/c", "/m", "-o", "writeback_delay=soon"]) }
        #expect(plain.writeBackMaxMiB == nil)
        #expect(try options(["http://h/c", "/m", "-o", "writeback,writeback_max_mb=512"]).writeBackMaxMiB == 512)
        for bad in ["writeback_max_mb=0", "writeback_max_mb=lots", "writeback_max_mb"] {
            #expect(throws: ConfigurationError.self) { try options(["http://h/c", "/m", "-o", bad]) }
        }
    }

    /// Relative paths are the caller's: the daemon's directory becomes `/` once it detaches.
    @Test func relativePathsAreResolvedAgainstTheCurrentDirectory() throws {
        guard case .mount(let o) = try Arguments.parse(
            ["http://h/c", "m", "-o", "cache_dir=c,passwd_file=../p,cafile=/etc/ca.pem"], directory: "/home/u")
        else { throw ConfigurationError("not a mount command") }
        #expect(o.mountpoint == "/home/u/m")
        #expect(o.cacheDirectory == "/home/u/c")
        #expect(o.passwdFile == "/home/u/../p")
        #expect(o.caFile == "/etc/ca.pem")
    }

    /// `\,` is a comma inside a value; `\\` a backslash.
    @Test func commasInPathsCanBeEscaped() throws {
        let o = try options(["http://h/c", "/m", "-o", #"cache_dir=/var/cache/a\,b,ro,passwd_file=/etc/p\\q"#])
        #expect(o.cacheDirectory == "/var/cache/a,b")
        #expect(o.readOnly)
        #expect(o.passwdFile == #"/etc/p\q"#)
    }

    /// mount(8) passes `-f` for `mount -f` (fake); run by hand, `-f` stays foreground.
    @Test func dashFIsFakeWhenMountRunsUs() throws {
        guard case .mount(let byMount) = try Arguments.parse(["http://h/c", "/m", "-f"], calledByMount: true),
            case .mount(let byHand) = try Arguments.parse(["http://h/c", "/m", "-f"])
        else { throw ConfigurationError("not a mount command") }
        #expect(byMount.fake && !byMount.foreground)
        #expect(byHand.foreground && !byHand.fake)
    }

    /// The mount's line in /run/mount/utab: the options mount(8) would have recorded there
    /// (`_netdev`, `x-*`), then `helper=cssp`, which makes umount(8) run the umount helper;
    /// no line with `-n` (mount(8)'s "no mtab"). helper=cssp given is not recorded twice.
    @Test func utabOptions() throws {
        let given = try options([
            "http://h/c", "/m", "-o", #"_netdev,nofail,x-systemd.automount,helper=cssp,x-a\,b=1,noatime,user"#,
        ])
        #expect(given.utabOptions == "_netdev,x-systemd.automount,helper=cssp")
        #expect(try options(["http://h/c", "/m"]).utabOptions == "helper=cssp")
        #expect(try options(["http://h/c", "/m", "-n", "-o", "_netdev"]).utabOptions == nil)
    }

    @Test func helpAndVersion() throws {
        #expect(try Arguments.parse(["--help"]) == .help)
        #expect(try Arguments.parse(["http://h/c", "-V"]) == .version)
    }

    @Test(arguments: [
        (["http://h/c"], "usage"),
        (["http://h/c", "/m", "/x"], "too many arguments"),
        (["http://h/c", "/m", "-o", "bogus"], "unknown option 'bogus'"),
        (["http://h/c", "/m", "-o", "="], "has no name"),
        (["http://h/c", "/m", "-o", "ro,=,rw"], "has no name"),
        (["http://h/c", "/m", "-o", "=5"], "has no name"),
        (["http://h/c", "/m", "-o", "low_speed_limit=0"], "option 'low_speed_limit'"),
        (["http://h/c", "/m", "-o", "copy_timeout=soon"], "option 'copy_timeout'"),
        (["http://h/c", "/m", "-o", "cafile"], "needs a value"),
        (["http://h/c", "/m", "-o", "uid=-1"], "option 'uid'"),
        (["http://h/c", "/m", "-o", "umask=999"], "octal"),
        (["http://h/c", "/m", "-o", "attr_timeout=abc"], "seconds"),
        (["http://h/c", "/m", "-o", "passwd_file"], "needs a value"),
        (["http://h/c", "/m", "-o", "cache_size=lots"], "needs a size such as 500M"),
        (["http://h/c", "/m", "-o", "cache_size=-1G"], "needs a size"),
        (["http://h/c", "/m", "-o", "cache_block_kb=1000"], "power of two"),
        (["http://h/c", "/m", "-o", "meta_prefetch=many"], "option 'meta_prefetch'"),
        (["http://h/c", "/m", "-o", "list_ahead=65"], "option 'list_ahead'"),
        (["http://h/c", "/m", "-x"], "unknown flag"),
        (["ftp://h/c", "/m"], "invalid URL"),
        (["http://h", "/m"], "names no container"),
        (["http://h:99999/c", "/m"], "invalid port"),
        (["http://user@h/c", "/m"], "invalid URL"),
        (["s3://", "/m"], "names no bucket"),
        (["s3://Big_Bucket", "/m"], "invalid bucket name"),
        (["cos://examplebucket", "/m", "-o", "region=ap-guangzhou"], "lacks its APPID"),
        (["cos://examplebucket-1250000000", "/m"], "-o region=REGION"),
        (["s3://b12", "/m", "-o", "region=Europe West"], "invalid region"),
        (["s3://b12", "/m", "-o", "endpoint=127.0.0.1:8480"], "invalid endpoint"),
        (["s3://b12", "/m", "-o", "endpoint=http://h:1/path"], "no path"),
        (["http://h/c", "/m", "-o", "endpoint=http://h:1"], "for s3:// and cos:// URLs"),
        (["http://h/c", "/m", "-o", "profile=work"], "for s3:// URLs"),
    ])
    func badInputSaysWhatIsWrong(arguments: [String], fragment: String) {
        do {
            _ = try Arguments.parse(arguments)
            Issue.record("accepted \(arguments)")
        } catch {
            #expect(error.message.contains(fragment), "\(error.message)")
            #expect(!error.message.contains("\n"))
        }
    }
}

/// s3:// and cos:// URLs and the options that say where their server is.
extension ArgumentsTests {
    @Test func anS3URLWithAnEndpointIsPathStyleThere() throws {
        let o = try options(["s3://photos/2026/", "/m", "-o", "endpoint=HTTP://127.0.0.1:8480/"])
        #expect(o.endpoint.dialect == .s3)
        #expect(o.endpoint.baseURL == "http://127.0.0.1:8480")
        #expect(o.endpoint.container == "photos" && o.endpoint.prefix == "2026/")
        #expect(o.endpoint.pathStyle && o.endpoint.region == "us-east-1")
        #expect(o.endpoint.url == "s3://photos/2026")
    }

    @Test func anS3URLWithoutAnEndpointIsAWSVirtualHostStyle() throws {
        let o = try options(["s3://photos", "/m", "-o", "region=eu-west-1"])
        #expect(o.endpoint.baseURL == "https://photos.s3.eu-west-1.amazonaws.com" && !o.endpoint.pathStyle)
        let forced = try options(["s3://photos", "/m", "-o", "path_style"])
        #expect(forced.endpoint.baseURL == "https://s3.us-east-1.amazonaws.com" && forced.endpoint.pathStyle)
        // A dot in the bucket would break the certificate's name: path-style.
        let dotted = try options(["s3://my.photos", "/m"])
        #expect(dotted.endpoint.pathStyle && dotted.endpoint.baseURL == "https://s3.us-east-1.amazonaws.com")
    }

    @Test func aCOSURLIsTheBucketsHostInItsRegion() throws {
        let o = try options(["cos://examplebucket-1250000000/docs", "/m", "-o", "region=ap-guangzhou"])
        #expect(o.endpoint.dialect == .cos)
        #expect(o.endpoint.baseURL == "https://examplebucket-1250000000.cos.ap-guangzhou.myqcloud.com")
        #expect(o.endpoint.container == "examplebucket-1250000000" && o.endpoint.prefix == "docs/")
        let local = try options(["cos://examplebucket-1250000000", "/m", "-o", "endpoint=http://127.0.0.1:8491"])
        #expect(local.endpoint.baseURL == "http://127.0.0.1:8491" && local.endpoint.pathStyle)
    }

    @Test func aCSSPURLIsUnchanged() throws {
        let o = try options(["http://h:1/c/p", "/m"])
        #expect(o.endpoint.dialect == .cssp && o.endpoint.url == "http://h:1/c/p")
    }
}

struct CredentialTests {
    let endpoint = try! Endpoint(parsing: "http://127.0.0.1:8480/photos")

    func files(_ table: [String: (String, UInt32)]) -> CredentialLoader.FileAccess {
        CredentialLoader.FileAccess { path in table[path].map { .success((contents: $0.0, mode: $0.1)) } }
    }

    @Test func endpointLineWinsOverDefault() throws {
        let text = """
            # comment
            DEFAULTKEY:defaultsecret
            http://other:1/photos:OTHER:othersecret
            http://127.0.0.1:8480/photos/:MINE:my/secret+=
            """
        let c = try CredentialLoader.parse(text, path: "/p", endpoint: endpoint)
        #expect(c.accessKey == "MINE" && c.secret == "my/secret+=")
        let fallback = try CredentialLoader.parse("K:S\n", path: "/p", endpoint: endpoint)
        #expect(fallback.accessKey == "K" && fallback.secret == "S")
        #expect(!fallback.description.contains("S\n"))
        #expect(!String(describing: fallback).contains(":S"))
    }

    @Test func malformedLinesAreReportedWithTheirNumber() {
        #expect(throws: ConfigurationError("/p line 2 is not ACCESS_KEY:SECRET or URL:ACCESS_KEY:SECRET")) {
            try CredentialLoader.parse("K:S\nnonsense\n", path: "/p", endpoint: endpoint)
        }
        #expect(throws: ConfigurationError.self) {
            try CredentialLoader.parse("http://other/c:K:S\n", path: "/p", endpoint: endpoint)
        }
    }

    @Test func searchOrderAndPermissions() throws {
        let table = files([
            "/opt": ("OPT:s", 0o100600), "/env": ("ENV:s", 0o100600), "/home/u/.passwd-cssp": ("HOME:s", 0o100600),
            "/etc/passwd-cssp": ("ETC:s", 0o100600), "/loose": ("L:s", 0o100644),
        ])
        let env = ["CSSP_PASSWD_FILE": "/env", "HOME": "/home/u", "CSSP_ACCESS_KEY_ID": "VAR", "CSSP_SECRET_ACCESS_KEY": "s"]
        func key(_ option: String?, _ env: [String: String], _ access: CredentialLoader.FileAccess) throws(ConfigurationError) -> String {
            try CredentialLoader.load(endpoint: endpoint, passwdFileOption: option, environment: env, fileAccess: access)
                .accessKey
        }
        #expect(try key("/opt", env, table) == "OPT")
        #expect(try key(nil, env, table) == "ENV")
        #expect(try key(nil, ["HOME": "/home/u"], table) == "HOME")
        #expect(try key(nil, [:], table) == "ETC")
        #expect(try key(nil, env.filter { $0.key.hasPrefix("CSSP_A") || $0.key.hasPrefix("CSSP_S") }, files([:])) == "VAR")
        do {
            _ = try key("/loose", [:], table)
            Issue.record("a group/other-readable passwd file was accepted")
        } catch {
            #expect(error.message.contains("chmod 600 /loose"))
        }
        #expect(throws: ConfigurationError("passwd file /missing does not exist")) {
            try key("/missing", [:], table)
        }
        do {
            _ = try key(nil, [:], files([:]))
            Issue.record("no credentials accepted")
        } catch {
            #expect(error.message.hasPrefix("no credentials"))
        }
    }
}

/// Every option the parser takes is documented in `--help` and in the man page. The names are
/// read from the parser's own `switch`, so a new option without documentation fails here.
struct StoreCredentialTests {
    let s3 = try! Endpoint(parsing: "s3://photos")
    let cos = try! Endpoint(parsing: "cos://examplebucket-1250000000")

    func files(_ table: [String: (String, UInt32)]) -> CredentialLoader.FileAccess {
        CredentialLoader.FileAccess { path in table[path].map { .success((contents: $0.0, mode: $0.1)) } }
    }

    static let awsFile = """
        [default]
        aws_access_key_id = DEFAULTKEY
        aws_secret_access_key = defaultsecret

        ; another
        [work]
        aws_access_key_id=WORKKEY
        aws_secret_access_key=work/secret
        aws_session_token=TOKEN
        """

    @Test func s3TakesTheOptionThenAWSVariablesThenTheProfile() throws {
        let table = files(["/pw": ("PW:s", 0o100600), "/h/.aws/credentials": (Self.awsFile, 0o100600)])
        let env = ["AWS_ACCESS_KEY_ID": "ENVKEY", "AWS_SECRET_ACCESS_KEY": "e", "AWS_SESSION_TOKEN": "T", "HOME": "/h"]
        func load(_ option: String?, _ env: [String: String], profile: String? = nil) throws(ConfigurationError) -> Credentials {
            try CredentialLoader.load(endpoint: s3, passwdFileOption: option, environment: env, profile: profile, fileAccess: table)
        }
        #expect(try load("/pw", env).accessKey == "PW")
        let fromEnvironment = try load(nil, env)
        #expect(fromEnvironment.accessKey == "ENVKEY" && fromEnvironment.sessionToken == "T")
        #expect(try load(nil, ["HOME": "/h"]).accessKey == "DEFAULTKEY")
        let work = try load(nil, ["HOME": "/h"], profile: "work")
        #expect(work.accessKey == "WORKKEY" && work.secret == "work/secret" && work.sessionToken == "TOKEN")
        #expect(try load(nil, ["HOME": "/h", "AWS_PROFILE": "work"]).accessKey == "WORKKEY")
        #expect(!work.description.contains("work/secret") && !work.description.contains("TOKEN"))
        // CSSP's own files and variables are not an S3 bucket's.
        let cssp = files(["/h/.passwd-cssp": ("CSSP:s", 0o100600), "/etc/passwd-cssp": ("CSSP:s", 0o100600)])
        do {
            _ = try CredentialLoader.load(
                endpoint: s3, passwdFileOption: nil, environment: ["HOME": "/h", "CSSP_ACCESS_KEY_ID": "C", "CSSP_SECRET_ACCESS_KEY": "s"],
                fileAccess: cssp)
            Issue.record("CSSP credentials were used for s3://")
        } catch {
            #expect(error.message.contains("AWS_ACCESS_KEY_ID") && error.message.contains("~/.aws/credentials"))
        }
    }

    @Test func anAWSCredentialsFileMustBePrivateAndHaveTheProfile() throws {
        func load(_ table: [String: (String, UInt32)], profile: String?) throws(ConfigurationError) -> Credentials {
            try CredentialLoader.load(endpoint: s3, passwdFileOption: nil, environment: ["HOME": "/h"], profile: profile, fileAccess: files(table))
        }
        #expect(throws: ConfigurationError(
            "credentials file /h/.aws/credentials is accessible by group or others: run chmod 600 /h/.aws/credentials")) {
            try load(["/h/.aws/credentials": (Self.awsFile, 0o100644)], profile: nil)
        }
        #expect(throws: ConfigurationError("/h/.aws/credentials has no [other] profile: add it, or pass -o profile=NAME")) {
            try load(["/h/.aws/credentials": (Self.awsFile, 0o100600)], profile: "other")
        }
        #expect(throws: ConfigurationError("credentials file /h/.aws/credentials does not exist")) {
            try load([:], profile: "work")
        }
        #expect(throws: ConfigurationError(
            "profile [default] of /h/.aws/credentials lacks aws_access_key_id or aws_secret_access_key")) {
            try load(["/h/.aws/credentials": ("[default]\naws_access_key_id=K\n", 0o100600)], profile: nil)
        }
    }

    @Test func cosTakesTheOptionThenTencentCloudVariables() throws {
        let env = ["TENCENTCLOUD_SECRET_ID": "AKID", "TENCENTCLOUD_SECRET_KEY": "k", "HOME": "/h"]
        let table = files(["/pw": ("cos://examplebucket-1250000000:LINE:s\nDEFAULT:s", 0o100600)])
        #expect(try CredentialLoader.load(endpoint: cos, passwdFileOption: "/pw", environment: env, fileAccess: table).accessKey == "LINE")
        #expect(try CredentialLoader.load(endpoint: cos, passwdFileOption: nil, environment: env, fileAccess: table).accessKey == "AKID")
        do {
            _ = try CredentialLoader.load(endpoint: cos, passwdFileOption: nil, environment: ["HOME": "/h"], fileAccess: table)
            Issue.record("no credentials accepted")
        } catch {
            #expect(error.message.contains("TENCENTCLOUD_SECRET_ID") && !error.message.contains("\n"))
        }
    }

    @Test func anAccessKeyMayHoldColons() throws {
        let plain = try CredentialLoader.parse("account:user:se/cret\n", path: "/p", endpoint: s3)
        #expect(plain.accessKey == "account:user" && plain.secret == "se/cret")
        let forBucket = try CredentialLoader.parse("s3://photos:account:user:k\nD:s\n", path: "/p", endpoint: s3)
        #expect(forBucket.accessKey == "account:user" && forBucket.secret == "k")
        let cssp = try Endpoint(parsing: "http://h:8490/c")
        #expect(try CredentialLoader.parse("http://h:8490/c:a:b:c\n", path: "/p", endpoint: cssp).accessKey == "a:b")
    }

    @Test func aPasswdFileLineNamesItsDialect() throws {
        let text = "http://h/photos:CSSP:s\ns3://photos:S3:s\ncos://photos-1:COS:s\n"
        #expect(try CredentialLoader.parse(text, path: "/p", endpoint: s3).accessKey == "S3")
        #expect(throws: ConfigurationError("/p has no ACCESS_KEY:SECRET line for s3://other")) {
            try CredentialLoader.parse(text, path: "/p", endpoint: try Endpoint(parsing: "s3://other"))
        }
    }
}

struct OptionDocumentationTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent()

    static func parsedOptionNames() throws -> [String] {
        let source = try String(contentsOf: root.appending(path: "Sources/MountCSSPConfig/MountOptions.swift"), encoding: .utf8)
        guard let start = source.range(of: "switch name {")?.upperBound,
              let end = source.range(of: "default:", range: start..<source.endIndex)?.lowerBound else {
            throw ConfigurationError("the option switch moved: update this test")
        }
        let cases = try Regex(#"case "([a-z_]+)""#)
        return source[start..<end].matches(of: cases).map { String($0.output[1].substring!) }
    }

    @Test func everyOptionIsInTheHelpAndTheManPage() throws {
        let names = try Self.parsedOptionNames()
        #expect(names.count > 30)
        let man = try String(contentsOf: Self.root.appending(path: "man/mount.cssp.8"), encoding: .utf8)
            .replacingOccurrences(of: #"\\f[BIRP]"#, with: "", options: .regularExpression)
            .replacingOccurrences(of: "\\", with: "")
        for name in names {
            let spelled = try Regex(#"(^|[ ,"])"# + name + #"([=, "]|$)"#).anchorsMatchLineEndings()
            let inHelp = Arguments.usage.contains(spelled), inMan = man.contains(spelled)
            #expect(inHelp, "--help does not mention -o \(name)")
            #expect(inMan, "man/mount.cssp.8 does not mention -o \(name)")
        }
    }
}

struct ControlQuestionTests {
    @Test func statsAndStatusTakeOneMountpoint() throws {
        #expect(try Arguments.parse(["--stats", "/mnt/x"]) == .ask(.stats, mountpoint: "/mnt/x"))
        #expect(try Arguments.parse(["/mnt/x", "--status"]) == .ask(.status, mountpoint: "/mnt/x"))
        #expect(throws: ConfigurationError.self) { try Arguments.parse(["--stats"]) }
        #expect(throws: ConfigurationError.self) { try Arguments.parse(["--status", "/a", "/b"]) }
    }
}

struct RateLimiterTests {
    @Test func aKindPassesFiveTimesAMinuteAndTheNextLineCountsTheRest() {
        var limiter = RateLimiter()
        for second in 0..<5 { #expect(limiter.admit("a", now: Double(second)) == 0) }
        for second in 5..<12 { #expect(limiter.admit("a", now: Double(second)) == nil) }
        // Another kind is not held back by the first.
        #expect(limiter.admit("b", now: 12) == 0)
        // A new minute: the first line says how many were dropped.
        #expect(limiter.admit("a", now: 61) == 7)
        #expect(limiter.admit("a", now: 62) == 0)
    }

    @Test func logLevelTakesTheDocumentedNames() throws {
        for level in ["error", "warn", "notice", "info", "debug"] {
            guard case .mount(let options) = try Arguments.parse(["http://h/c", "/m", "-o", "log_level=" + level]) else {
                Issue.record("not a mount")
                return
            }
            #expect(options.logLevel == level)
        }
        #expect(throws: ConfigurationError.self) { try Arguments.parse(["http://h/c", "/m", "-o", "log_level=loud"]) }
    }
}

#!/usr/bin/env bash
# Builds the container image gpujob's docker-driver tests and the dev cluster
# train in, without a base image or a registry: the root filesystem is made of
# the files of this machine's installed Debian packages python3 and
# python3-torch and their dependency closure, plus the checkout's
# jobspecs/workloads/ in /opt/gpujob/workloads, and goes into the daemon with
# `docker import`. Nothing is pulled.
#
# The tag is content-addressed: gpujob-train:<12 hex digits of the sha256 of
# the closure's package=version list, the workloads' contents and this
# script>. When the daemon already has that tag the script does nothing, so a
# warm run (CI on a machine that built it before: the dev cluster's dockerd
# keeps its images in the agent cache) takes 0.3 s. The image is
# also tagged gpujob-train:local, the stable name jobspecs/examples/bert-image.hcl
# uses; never :latest, which Nomad's docker driver always tries to pull (and
# there is no registry).
#
# Its ENTRYPOINT is python3, as many training images have: a job that ran
# command/args through it instead of replacing it would fail (run by hand:
# `docker run --rm IMAGE -c 'import torch'`).
#
# What goes in, from each package's file list (dpkg):
#   - everything under /usr/lib/python3*/ (the interpreter's library and
#     dist-packages), with the byte-code the host compiled for it at install
#     time (Debian packages ship none: without it every rank would compile
#     torch's Python again at each start, ~1.7 s here);
#   - /usr/bin/python3* and dash as /bin/sh;
#   - of the shared libraries, only those the dynamic linker loads for them:
#     the DT_NEEDED closure of the interpreter and of every extension module
#     (which drops, e.g., Mesa's GL drivers and LLVM, dlopened by libGL for a
#     display there is none of);
#   - the other files (configuration, data) of the packages that contribute a
#     library or Python code, and tzdata and media-types (the Python library
#     reads them): other data-only packages (fonts, GDAL's data, perl,
#     dpkg, ...) are in the closure only through such libraries' or the
#     maintainer scripts' Depends and are left out;
#   - never: documentation, man and info pages, translations, headers, static
#     libraries, the test suites in dist-packages (*/tests/, torch's C++ test
#     binaries and libtorch-test).
# Plus /etc/passwd and /etc/group (root, nobody/nogroup), /etc/nsswitch.conf,
# the host's ld.so.cache and ld.so.conf, /tmp (1777).
#
# Usage: scripts/build-train-image.sh [--ref] [--force]
#   --ref    print the image ref the current inputs give and exit (nothing is built)
#   --force  build and import even if the daemon has the tag
# The image ref is the last line on stdout; progress goes to stderr.
#
# Environment:
#   GPUJOB_DOCKER_CLI  the docker client (/usr/bin/docker: Debian's, which matches the daemon)
#   DOCKER_HOST        the daemon; when unset and a dev cluster started with
#                      GPUJOB_DEV_DOCKER=1 is up in GPUJOB_DEV_DIR, that cluster's dockerd
#   GPUJOB_TRAIN_IMAGE_PACKAGES  the root packages ("python3 python3-torch")
#   GPUJOB_TRAIN_IMAGE_KEEP      builds kept in the daemon, this one included (3): a new
#                      build removes older gpujob-train tags beyond that
#   GPUJOB_DEV_DIR     where to look for that dev cluster (/tmp/gpujob-dev)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$here/lib.sh"

only_ref=0 force=0
for a in "$@"; do
	case $a in
	--ref) only_ref=1 ;;
	--force) force=1 ;;
	-h | --help)
		sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
		exit 0
		;;
	*) die "usage: $0 [--ref] [--force]" ;;
	esac
done

docker_cli=$(gpujob_docker_cli)
py=/usr/bin/python3
name=gpujob-train
workloads=$repo/jobspecs/workloads
read -r -a root_packages <<<"${GPUJOB_TRAIN_IMAGE_PACKAGES:-python3 python3-torch}"
# dash is /bin/sh: not a dependency of either, but what os.system,
# subprocess(shell=True) and a `docker exec ... sh` expect.
extra_packages=(dash)

[ -x "$py" ] || die "$py is needed (Debian's python3; install the packages with scripts/install-deps.sh)"
for p in "${root_packages[@]}"; do
	dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep '^ii' >/dev/null ||
		die "package $p is not installed (scripts/install-deps.sh installs it)"
done
[ -d "$workloads" ] || die "no $workloads"

# The python part: the dependency closure (mode pkgs: one package:arch=version
# a line, sorted) and the file list (mode files: NUL-separated paths relative
# to /, parents before children).
helper() {
	"$py" - "$@" <<'PY'
import fnmatch, os, re, stat, struct, subprocess, sys

mode, roots, extras = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
stage, host_list, stage_list = (sys.argv[4:7] + [None] * 3)[:3]
native = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True).stdout.strip()

# ---- installed packages and their Depends/Pre-Depends closure ----
fmt = "${Package}\t${Architecture}\t${db:Status-Abbrev}\t${Version}\t${Provides}\t${Pre-Depends}\t${Depends}\n"
out = subprocess.run(["dpkg-query", "-W", "-f=" + fmt], capture_output=True, text=True, check=True).stdout
pkgs, provides = {}, {}
for line in out.splitlines():
    name, arch, status, version, prov, pre, dep = line.split("\t")
    if not status.startswith("ii") or arch not in (native, "all"):
        continue
    pkgs[name] = dict(arch=arch, version=version, deps=", ".join(d for d in (pre, dep) if d.strip()))
    for p in prov.split(","):
        p = p.strip().split(" ")[0]
        if p:
            provides.setdefault(p, set()).add(name)

def installed(dep):
    n = dep.strip().split(" ")[0].split(":")[0]
    if n in pkgs:
        return n
    if n in provides:
        return sorted(provides[n])[0]
    return None

def closure(start):
    seen, todo = set(), list(start)
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        for clause in pkgs[p]["deps"].split(","):
            if not clause.strip():
                continue
            # An alternative (a | b) or a virtual package: what is installed.
            for alt in clause.split("|"):
                r = installed(alt)
                if r:
                    todo.append(r)
                    break
    return seen

closed = closure(roots)
if mode == "pkgs":
    for p in sorted(closed):
        print("%s:%s=%s" % (p, pkgs[p]["arch"], pkgs[p]["version"]))
    sys.exit(0)
closed |= {p for p in extras if p in pkgs}

# ---- files ----
def listing(p):
    for f in ("/var/lib/dpkg/info/%s:%s.list" % (p, pkgs[p]["arch"]), "/var/lib/dpkg/info/%s.list" % p):
        if os.path.exists(f):
            with open(f) as fh:
                return [l.rstrip("\n") for l in fh if l.strip()]
    return []

def canon(path):
    # The real directory, the name itself: a symlink stays a symlink. dpkg
    # lists /lib/... where merged-/usr has the file in /usr/lib/...
    d, b = os.path.split(path)
    return os.path.join(os.path.realpath(d), b)

PY_DIRS = re.compile(r"^/usr/lib/python3(\.[0-9]+)?/")
EXCLUDE_DIRS = ("/usr/share/doc/", "/usr/share/man/", "/usr/share/info/", "/usr/share/locale/",
                "/usr/share/lintian/", "/usr/share/bug/", "/usr/share/doc-base/", "/usr/share/gtk-doc/",
                "/usr/share/help/", "/usr/include/", "/usr/lib/libtorch-test/")
EXCLUDE_NAMES = ("*.a", "*.la", "*.h", "*.hh", "*.hpp", "*.cuh")
EXCLUDE_GLOBS = ("*/dist-packages/*/tests/*", "*/dist-packages/*/tests",
                 "*/dist-packages/torch/test", "*/dist-packages/torch/include/*", "*/dist-packages/torch/include",
                 "*/dist-packages/torch/bin/*Test", "*/dist-packages/torch/bin/test_*",
                 "*/dist-packages/torch/bin/tutorial_*")
ROOT_BIN_PACKAGES = re.compile(r"^(python3(\.[0-9]+)?(-minimal)?|dash)$")

def excluded(path):
    return (path.startswith(EXCLUDE_DIRS) or "/__pycache__/" in path
            or any(fnmatch.fnmatch(os.path.basename(path), g) for g in EXCLUDE_NAMES)
            or any(fnmatch.fnmatch(path, g) for g in EXCLUDE_GLOBS))

def is_elf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False

def dynamic(path):
    """DT_NEEDED names and RPATH/RUNPATH dirs of an ELF file (64-bit little-endian, as this machine's)."""
    with open(path, "rb") as f:
        h = f.read(64)
        if h[:4] != b"\x7fELF" or h[4] != 2 or h[5] != 1:
            return [], []
        phoff, = struct.unpack_from("<Q", h, 32)
        phentsize, phnum = struct.unpack_from("<HH", h, 54)
        f.seek(phoff)
        ph = f.read(phentsize * phnum)
        loads, dyn = [], None
        for i in range(phnum):
            t, _, off, vaddr, _, filesz, _, _ = struct.unpack_from("<IIQQQQQQ", ph, i * phentsize)
            if t == 1:
                loads.append((vaddr, off, filesz))
            elif t == 2:
                dyn = (off, filesz)
        if not dyn:
            return [], []
        f.seek(dyn[0])
        d = f.read(dyn[1])
        ents = [struct.unpack_from("<qQ", d, i) for i in range(0, len(d) - 15, 16)]
        strtab = next((v for t, v in ents if t == 5), None)
        base = None
        for va, o, sz in loads:
            if strtab is not None and va <= strtab < va + sz:
                base = strtab - va + o
        if base is None:
            return [], []
        def string(off):
            f.seek(base + off)
            b = b""
            while True:
                c = f.read(256)
                i = c.find(b"\0")
                if i >= 0 or not c:
                    return (b + c[:max(i, 0)]).decode(errors="replace")
                b += c
        needed = [string(v) for t, v in ents if t == 1]
        paths = [string(v) for t, v in ents if t in (15, 29)]
    return needed, [p for s in paths for p in s.split(":") if p]

# name -> paths, from the host's loader cache (the image gets the same cache).
want = {"amd64": "x86-64", "arm64": "AArch64"}.get(native)
ldcache = {}
for line in subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True).stdout.splitlines()[1:]:
    m = re.match(r"\s+(\S+) \(([^)]*)\) => (\S+)$", line)
    if m and (want is None or want in m.group(2)):
        ldcache.setdefault(m.group(1), []).append(m.group(3))
import sysconfig
triplet = sysconfig.get_config_var("MULTIARCH") or ""
default_dirs = ["/lib/" + triplet, "/usr/lib/" + triplet, "/lib", "/usr/lib", "/lib64", "/usr/lib64"]

def resolve(name, dirs):
    if "/" in name:
        return name if os.path.exists(name) else None
    for d in dirs + ldcache.get(name, []) + default_dirs:
        p = d if d.endswith("/" + name) else os.path.join(d, name)
        if os.path.exists(p) and is_elf(os.path.realpath(p)):
            return p
    return None

keep, owner = set(), {}

def add_chain(path):
    """Keeps PATH and, while it is a symlink, what it points to, hop by hop;
    returns the final target's canonical path."""
    path = canon(path)
    for _ in range(40):
        if not os.path.lexists(path):
            return path  # what a dangling link points to: the link is kept, harmless
        keep.add(path)
        if not os.path.islink(path):
            return path
        t = os.readlink(path)
        path = canon(os.path.join(os.path.dirname(path), t))
    return path

elf_roots, misc = [], {}
live = set()
for p in sorted(closed):
    for f in listing(p):
        if not os.path.lexists(f):
            continue  # a file dpkg lists but the machine does not have (path-exclude)
        c = canon(f)
        st = os.lstat(c)
        if stat.S_ISDIR(st.st_mode):
            continue
        owner.setdefault(c, p)
        if excluded(c):
            continue
        if PY_DIRS.match(c) or (ROOT_BIN_PACKAGES.match(p) and re.match(r"^/usr/s?bin/", c)):
            live.add(p)
            target = add_chain(c)
            if os.path.isfile(target) and is_elf(target):
                elf_roots.append(c)
            if c.endswith(".py") and stat.S_ISREG(st.st_mode):
                d, b = os.path.split(c)
                tag = "cpython-%d%d" % sys.version_info[:2]
                pyc = os.path.join(d, "__pycache__", b[:-3] + "." + tag + ".pyc")
                if os.path.isfile(pyc):
                    keep.add(pyc)
        elif stat.S_ISREG(st.st_mode) and is_elf(c):
            pass  # a library or program: kept only if the linker loads it (below)
        else:
            misc.setdefault(p, []).append(c)

# The dynamic linker's closure of the roots. An object is known by the path
# it is opened under: the loader expands $ORIGIN in its RUNPATH from that
# path, not from the file's real one (libblas.so.3, opened as the
# alternatives link in /usr/lib/<triplet>, finds libopenblas.so.0 there, not
# beside the real file); both are tried, and whatever either finds is kept.
parsed = {}
seen, todo = set(), list(elf_roots)
while todo:
    opened = todo.pop()
    if opened in seen:
        continue
    seen.add(opened)
    real = os.path.realpath(opened)
    if owner.get(real):
        live.add(owner[real])
    if real not in parsed:
        parsed[real] = dynamic(real)
    needed, raw_dirs = parsed[real]
    for origin in {os.path.dirname(opened), os.path.dirname(real)}:
        dirs = [d.replace("${ORIGIN}", origin).replace("$ORIGIN", origin) for d in raw_dirs]
        for n in needed:
            r = resolve(n, dirs)
            if r is None:
                print("warning: %s needs %s, which is not found" % (real, n), file=sys.stderr)
                continue
            add_chain(r)
            todo.append(canon(r))

# Data the Python library reads when asked (zoneinfo, mimetypes), though no
# library of the closure needs it.
live |= {"tzdata", "media-types"} & closed
for p in live:
    for c in misc.get(p, []):
        add_chain(c)

# The loader's configuration, as on the host (the cache lists more than the
# image has: a missing entry just falls through to the search path).
loader_files = ["/etc/ld.so.cache", "/etc/ld.so.conf"]
if os.path.isdir("/etc/ld.so.conf.d"):
    loader_files += [os.path.join("/etc/ld.so.conf.d", x) for x in sorted(os.listdir("/etc/ld.so.conf.d"))]
for f in loader_files:
    if os.path.lexists(f):
        add_chain(f)

# Parents, and the merged-/usr links (/lib -> usr/lib, ...) under which
# programs and ELF interpreters name paths.
out = set(keep)
for f in keep:
    d = os.path.dirname(f)
    while d not in ("/", ""):
        out.add(d)
        d = os.path.dirname(d)
for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
    if os.path.islink(top):
        t = os.path.realpath(top)
        if any(k.startswith(t + "/") for k in keep):
            out.add(top)

# The stage (users, /tmp, the workloads) goes on top: a file it has replaces
# the host's, a directory both have is listed once (docker import refuses an
# archive that names a path twice).
staged = set()
for d, dirs, files in os.walk(stage):
    for n in dirs + files:
        staged.add("/" + os.path.relpath(os.path.join(d, n), stage))
stage_only = sorted(f for f in staged if not (f in out and os.path.isdir(f) and not os.path.islink(f)
                                              and os.path.isdir(os.path.join(stage, f[1:]))))
out -= set(stage_only)

size = sum(os.lstat(f).st_size for f in out if stat.S_ISREG(os.lstat(f).st_mode))
by_pkg = {}
for f in out:
    if owner.get(f) and stat.S_ISREG(os.lstat(f).st_mode):
        by_pkg[owner[f]] = by_pkg.get(owner[f], 0) + os.lstat(f).st_size
dropped = sorted(p for p in closed if p not in live)
print("%d packages in the closure, %d left out as unused at run time (%s)"
      % (len(closed), len(dropped), " ".join(dropped)), file=sys.stderr)
print("%d paths from the packages, %.0f MiB; the largest: %s"
      % (len(out), size / 2**20, ", ".join("%s %.0f MiB" % (p, b / 2**20) for p, b in
                                            sorted(by_pkg.items(), key=lambda x: -x[1])[:10])), file=sys.stderr)
with open(host_list, "w") as fh:
    fh.write("".join(f.lstrip("/") + "\0" for f in sorted(out)))
with open(stage_list, "w") as fh:
    fh.write("".join(f.lstrip("/") + "\0" for f in stage_only))
PY
}

# ---- the tag: what the image is made of ------------------------------------

t0=$(gpujob_now_ms)
pkg_list=$(helper pkgs "${root_packages[*]}" "${extra_packages[*]}")
extra_versions=$(dpkg-query -W -f='${Package}:${Architecture}=${Version}\n' "${extra_packages[@]}" 2>/dev/null || true)
workloads_sum=$(cd "$workloads" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
hash=$({
	printf 'arch %s\n' "$(dpkg --print-architecture)"
	printf '%s\n' "$pkg_list" "$extra_versions"
	printf 'workloads %s\n' "$workloads_sum"
	sha256sum <"$0"
} | sha256sum | cut -c1-12)
ref=$name:$hash
if ((only_ref)); then
	echo "$ref"
	exit 0
fi

# The daemon: DOCKER_HOST, else the dev cluster's dockerd when one is up.
if [ -z "${DOCKER_HOST:-}" ]; then
	dev_dir=$(gpujob_dev_dir)
	if [ -f "$dev_dir/env" ]; then
		dev_host=$(gpujob_dev_env_value "$dev_dir" DOCKER_HOST)
		if [ -n "$dev_host" ]; then
			export DOCKER_HOST=$dev_host
			log "using the dev cluster's dockerd: DOCKER_HOST=$DOCKER_HOST"
		fi
	fi
fi
[ -x "$docker_cli" ] || die "no docker client at $docker_cli (set GPUJOB_DOCKER_CLI; scripts/install-deps.sh installs docker.io)"
"$docker_cli" version --format '{{.Server.Version}}' >/dev/null 2>&1 ||
	die "no docker daemon answers at ${DOCKER_HOST:-the default socket} (start a dev cluster with GPUJOB_DEV_DOCKER=1 and source its env, or set DOCKER_HOST)"

# One build at a time per machine (concurrent test packages may all ask).
lock_dir=$(gpujob_cache_dir)
mkdir -p "$lock_dir"
exec 9>>"$lock_dir/train-image.lock"
flock 9

if ((force == 0)) && "$docker_cli" image inspect --format '{{.Id}}' "$ref" >/dev/null 2>&1; then
	if [ "$("$docker_cli" image inspect --format '{{.Id}}' "$name:local" 2>/dev/null)" != \
		"$("$docker_cli" image inspect --format '{{.Id}}' "$ref")" ]; then
		"$docker_cli" tag "$ref" "$name:local"
	fi
	log "$ref is up to date ($(gpujob_elapsed "$t0"))"
	echo "$ref"
	exit 0
fi

# ---- build --------------------------------------------------------------------

log "building $ref from the installed packages ${root_packages[*]} and their dependencies"
work=$(mktemp -d "${TMPDIR:-/tmp}/gpujob-train-image.XXXXXX")
trap 'rm -rf "$work"' EXIT

# What no package has: users, name service, /tmp, the workloads.
stage=$work/stage
mkdir -p "$stage/etc" "$stage/tmp" "$stage/opt/gpujob" "$stage/root"
chmod 1777 "$stage/tmp"
chmod 0700 "$stage/root"
cat >"$stage/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
EOF
cat >"$stage/etc/group" <<'EOF'
root:x:0:
nogroup:x:65534:
EOF
cat >"$stage/etc/nsswitch.conf" <<'EOF'
passwd: files
group:  files
shadow: files
hosts:  files dns
networks: files
protocols: files
services: files
EOF
cp -R "$workloads" "$stage/opt/gpujob/workloads"
find "$stage/opt" -name __pycache__ -prune -exec rm -rf {} +
chmod -R a+rX,go-w "$stage/etc" "$stage/opt"

helper files "${root_packages[*]}" "${extra_packages[*]}" "$stage" "$work/host.list" "$work/stage.list"

# Each list names every directory, parents before children: no recursion.
t1=$(gpujob_now_ms)
tar --create --numeric-owner --no-recursion --null -C / -T "$work/host.list" -C "$stage" -T "$work/stage.list" |
	"$docker_cli" import \
		--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
		--change 'ENV LANG=C.UTF-8' \
		--change "LABEL org.opencontainers.image.title=$name org.gpujob.inputs=$hash" \
		--change 'ENTRYPOINT ["/usr/bin/python3"]' \
		--message "scripts/build-train-image.sh: ${root_packages[*]} from $(hostname)" \
		- "$ref" >/dev/null
"$docker_cli" tag "$ref" "$name:local"
size=$("$docker_cli" image inspect --format '{{.Size}}' "$ref")
log "imported $ref: $((size / 1024 / 1024)) MiB in $(gpujob_elapsed "$t1") (total $(gpujob_elapsed "$t0"))"

# Each build is a single layer of its own: older ones would pile up in the
# data-root (which outlives clusters) at every change of the workloads or
# the packages. The newest GPUJOB_TRAIN_IMAGE_KEEP (3, this one included)
# stay, another checkout may still run one; an image a container uses stays
# too (no -f).
keep_n=${GPUJOB_TRAIN_IMAGE_KEEP:-3}
[[ $keep_n =~ ^[1-9][0-9]*$ ]] || die "GPUJOB_TRAIN_IMAGE_KEEP must be 1 or more, got '$keep_n'"
mapfile -t old < <("$docker_cli" images --format '{{.Tag}}' "$name" | grep -vx -e local -e latest -e "$hash" | tail -n +"$keep_n")
if [ ${#old[@]} -gt 0 ]; then
	log "removing ${#old[@]} older build(s): ${old[*]/#/$name:}"
	"$docker_cli" rmi "${old[@]/#/$name:}" >/dev/null 2>&1 || true
fi
echo "$ref"

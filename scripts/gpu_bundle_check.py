#!/usr/bin/env python3
"""Proves a trainer-only build used the dependency bundle and nothing else.

scripts/gpu-check.sh --dry-run runs this on a Debian machine where the
system's -dev packages (libabsl-dev, nlohmann-json3-dev, gRPC, ...) ARE
installed, so a build that silently reads one of them would still compile;
these checks catch that:

  selftest BUNDLE                  negative control: preprocesses an Abseil and
                                   a nlohmann-json include with and without the
                                   bundle and checks that `headers`' classifier
                                   flags the system copies (and only those)
  cache BUILD BUNDLE               CMakeCache: absl/nlohmann_json/CLI11/GTest
                                   configs come from BUNDLE; gRPC, SQLite3,
                                   spdlog, yaml-cpp, Boost not searched
  headers BUILD BUNDLE             every header any object read (ninja -t deps,
                                   i.e. the compilers' depfiles) is in the
                                   source tree, the build tree, BUNDLE, the CUDA
                                   toolkit, or a Debian package in ALLOWED
  link [--torch-dir=D] BUILD BUNDLE BINARY...
                                   link lines name no library outside those
                                   places; the binaries' DT_NEEDED entries are
                                   LibTorch, CUDA, NCCL and the C/C++ runtime,
                                   or what LibTorch's CMake export (Torch_DIR
                                   D and its Caffe2 folder) links itself

ALLOWED are the C/C++ toolchain's packages and Debian's LibTorch (the CPU
stand-in for the node's PyTorch LibTorch) with the headers its own public
headers pull in. Exit status 1 with the offending paths on any violation.
"""

import os
import re
import subprocess
import sys
import tempfile

# Debian packages a header may come from. Anything else under /usr fails.
ALLOWED_PACKAGES = {
    # C/C++ toolchain and kernel headers (a CUDA node has its own).
    "libc6-dev", "linux-libc-dev", "libstdc++-12-dev", "libgcc-12-dev", "libcrypt-dev",
    "libgomp1",
    # Debian's CPU LibTorch, standing in for torch.utils.cmake_prefix_path.
    "libtorch-dev",
    # Included by LibTorch's own public headers (a PyTorch wheel ships gloo
    # inside torch/include and has no glog): c10d's ProcessGroupGloo.hpp
    # includes gloo; Debian builds c10 with C10_USE_GLOG, so
    # c10/util/Logging.h includes glog and gflags.
    "libgloo-dev", "libgoogle-glog-dev", "libgflags-dev",
}
# Packages that must never be read: the bundled ones (their copies in the
# bundle must win) and the service's dependencies the node does not have.
DENIED_PACKAGES = re.compile(
    r"^(libabsl-dev|nlohmann-json3-dev|libcli11-dev|libgtest-dev|libgmock-dev|googletest"
    r"|libgrpc.*|protobuf.*|libprotobuf.*|libsqlite3-dev|libspdlog-dev|libfmt-dev"
    r"|libyaml-cpp-dev|libboost.*)$")
# Direct shared-library dependencies a trainer-only binary may have (libmvec:
# glibc's vector math, as libm; the fused CPU kernels' vector exp).
ALLOWED_NEEDED = re.compile(
    r"^(libtorch[a-z_]*\.so.*|libc10[a-z_]*\.so.*|libcaffe2[a-z_]*\.so.*|libcudart\.so.*"
    r"|libnccl\.so.*|libcuda\.so.*|libnvToolsExt\.so.*|libgomp\.so.*|libstdc\+\+\.so.*"
    r"|libgcc_s\.so.*|libc\.so.*|libm\.so.*|libmvec\.so.*|libpthread\.so.*|libdl\.so.*"
    r"|librt\.so.*"
    r"|libatomic\.so.*|ld-linux.*|libgloo\.so.*)$")
BUNDLED_MARKERS = ("absl/", "nlohmann/", "CLI/", "gtest/", "gmock/")


def fail(msg, items=()):
    print(f"gpu-bundle-check: FAIL: {msg}", file=sys.stderr)
    for i in list(items)[:40]:
        print(f"  {i}", file=sys.stderr)
    sys.exit(1)


def owners(paths):
    """Maps absolute paths to their Debian package (dpkg -S), None if none."""
    out = {p: None for p in paths}
    paths = sorted(paths)
    for i in range(0, len(paths), 500):
        chunk = paths[i:i + 500]
        r = subprocess.run(["dpkg", "-S"] + chunk, capture_output=True, text=True)
        for line in r.stdout.splitlines():
            pkgs, _, path = line.partition(": ")
            if path in out:
                out[path] = pkgs.split(",")[0].split(":")[0].strip()
    # dpkg records /usr/lib/x86_64-linux-gnu/... but a file may be reached via
    # /lib/... (merged /usr) or a symlinked dir: retry with the real path.
    for p, pkg in list(out.items()):
        if pkg is None:
            real = os.path.realpath(p)
            if real != p:
                r = subprocess.run(["dpkg", "-S", real], capture_output=True, text=True)
                if r.returncode == 0:
                    out[p] = r.stdout.split(":")[0].split(",")[0].strip()
    return out


def inside(path, roots):
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots if r)


def classify(headers, bundle, project_roots):
    """(counts by origin, violations) for absolute header paths."""
    counts, system = {}, []
    cuda_roots = ["/usr/local/cuda", os.path.realpath("/usr/local/cuda")] + \
        [os.path.join("/usr/local", d) for d in os.listdir("/usr/local") if d.startswith("cuda")]
    for h in headers:
        if inside(h, [bundle]):
            key = "bundle"
        elif inside(h, project_roots):
            key = "project"
        elif inside(h, cuda_roots):
            key = "cuda toolkit"
        else:
            system.append(h)
            continue
        counts[key] = counts.get(key, 0) + 1
    violations = []
    for h, pkg in owners(system).items():
        key = f"debian:{pkg}" if pkg else "unowned"
        counts[key] = counts.get(key, 0) + 1
        if pkg is None or pkg not in ALLOWED_PACKAGES or DENIED_PACKAGES.match(pkg):
            violations.append(f"{h} ({pkg or 'no Debian package'})")
    return counts, sorted(violations)


def ninja_deps(build):
    r = subprocess.run(["ninja", "-C", build, "-t", "deps"], capture_output=True, text=True,
                       check=True)
    objs, headers = 0, set()
    for line in r.stdout.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            objs += 1
            if "(VALID)" not in line and "deps mtime" in line and "STALE" in line:
                fail(f"stale depfile record: {line}")
            continue
        p = line.strip()
        if not os.path.isabs(p):
            p = os.path.join(build, p)
        headers.add(os.path.normpath(p))
    return objs, headers


def cmd_headers(build, bundle):
    build, bundle = os.path.realpath(build), os.path.realpath(bundle)
    root = os.path.realpath(os.path.join(os.path.dirname(__file__), ".."))
    objs, headers = ninja_deps(build)
    if objs == 0:
        fail(f"ninja -t deps lists no objects in {build}")
    counts, violations = classify(headers, bundle, [root, build])
    bundled_read = sorted({m for h in headers if inside(h, [bundle])
                           for m in BUNDLED_MARKERS if f"/include/{m}" in h})
    print(f"gpu-bundle-check: headers: {objs} objects, {len(headers)} distinct files: "
          + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if violations:
        fail("headers read from outside the bundle, project, CUDA and allowed packages",
             violations)
    for m in ("absl/", "nlohmann/", "CLI/", "gtest/"):
        if m not in bundled_read:
            fail(f"no {m} header was read from the bundle: the check would prove nothing")
    print("gpu-bundle-check: headers: OK (absl, nlohmann, CLI11, gtest/gmock read from the bundle)")


def cmd_cache(build, bundle):
    bundle = os.path.realpath(bundle)
    cache = {}
    with open(os.path.join(build, "CMakeCache.txt")) as f:
        for line in f:
            m = re.match(r"^([A-Za-z0-9_.+-]+):[A-Z]+=(.*)$", line.strip())
            if m:
                cache[m.group(1)] = m.group(2)
    bad = []
    for var in ("absl_DIR", "nlohmann_json_DIR", "CLI11_DIR", "GTest_DIR"):
        v = cache.get(var, "")
        if not v or not inside(os.path.realpath(v), [bundle]):
            bad.append(f"{var}={v!r} is not in {bundle}")
    # Not Protobuf_*: Debian's TorchConfig (Caffe2Config) finds protobuf for
    # its own imported targets; the header and link checks still forbid it.
    for var in ("gRPC_DIR", "SQLite3_INCLUDE_DIR", "SQLite3_LIBRARY", "spdlog_DIR",
                "yaml-cpp_DIR", "Boost_INCLUDE_DIR", "Boost_DIR"):
        if var in cache:
            bad.append(f"{var} was searched ({cache[var]!r}): the trainer-only build must not")
    if cache.get("DEPTHBENCH_TRAINER_ONLY", "").upper() not in ("ON", "TRUE", "1"):
        bad.append("DEPTHBENCH_TRAINER_ONLY is not ON")
    if bad:
        fail("CMake configuration", bad)
    print("gpu-bundle-check: cache: OK (absl, nlohmann_json, CLI11, GTest configs from the bundle; "
          "no gRPC/SQLite3/spdlog/yaml-cpp/Boost searched)")


def lib_stem(name):
    """libprotobuf.so.32 -> protobuf; libglog.so.0.6.0 -> glog."""
    base = os.path.basename(name)
    base = base[3:] if base.startswith("lib") else base
    return re.split(r"\.(so|a)\b", base)[0]


def torch_link_interface(torch_dir):
    """Names in the LibTorch CMake export's INTERFACE_LINK_LIBRARIES
    (protobuf::libprotobuf -> protobuf, glog::glog -> glog, gflags): what
    find_package(Torch) itself puts on every link line that uses torch."""
    names = set()
    if not torch_dir:
        return names
    for d in (torch_dir, os.path.join(torch_dir, "..", "Caffe2")):
        if not os.path.isdir(d):
            continue
        for f in os.listdir(d):
            if not f.endswith(".cmake"):
                continue
            with open(os.path.join(d, f), errors="replace") as fh:
                for m in re.finditer(r'INTERFACE_LINK_LIBRARIES "([^"]*)"', fh.read()):
                    for item in m.group(1).split(";"):
                        item = item.split("::")[-1]
                        if re.match(r"^[A-Za-z][A-Za-z0-9_+-]*$", item):
                            names.add(item[3:] if item.startswith("lib") else item)
    return names


def cmd_link(build, bundle, binaries, torch_dir=None):
    build, bundle = os.path.realpath(build), os.path.realpath(bundle)
    root = os.path.realpath(os.path.join(os.path.dirname(__file__), ".."))
    via_torch = torch_link_interface(torch_dir)
    bad, libs, from_torch = [], set(), set()
    for b in binaries:
        target = os.path.basename(b)
        r = subprocess.run(["ninja", "-C", build, "-t", "commands", target], capture_output=True,
                           text=True, check=True)
        link = [c for c in r.stdout.splitlines() if f"-o {os.path.relpath(b, build)}" in c
                or f"-o {b}" in c]
        if not link:
            fail(f"no link command for {b}")
        for tok in link[-1].split():
            if tok.startswith("-l") and re.match(
                    r"^-l(absl|gtest|gmock|grpc|gpr|protobuf|sqlite3|spdlog|fmt|yaml-cpp|boost)", tok):
                bad.append(f"{target}: links {tok}")
            elif re.search(r"\.(a|so)(\.[0-9.]+)?$", tok):
                p = os.path.normpath(tok if os.path.isabs(tok) else os.path.join(build, tok))
                if not inside(p, [build, bundle, root]) and not p.startswith("/usr/local/cuda"):
                    libs.add(p)
        out = subprocess.run(["readelf", "-d", b], capture_output=True, text=True, check=True).stdout
        for needed in re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out):
            if ALLOWED_NEEDED.match(needed):
                continue
            if lib_stem(needed) in via_torch:
                from_torch.add(needed)
            else:
                bad.append(f"{target}: DT_NEEDED {needed}")
    for p, pkg in owners(libs).items():
        if lib_stem(p) in via_torch:
            from_torch.add(os.path.basename(p))
        elif pkg is None and "/torch/" not in p:
            bad.append(f"links {p} (no Debian package, not LibTorch)")
        elif pkg is not None and (pkg not in ALLOWED_PACKAGES | {"libtorch1.13", "libtorch-dev"}
                                  or DENIED_PACKAGES.match(pkg)):
            bad.append(f"links {p} ({pkg})")
    if bad:
        fail("libraries from outside the bundle", bad)
    print(f"gpu-bundle-check: link: OK ({len(binaries)} binaries; system libraries on the link "
          f"lines: {', '.join(sorted(os.path.basename(l) for l in libs)) or 'none'}; of these, "
          f"from LibTorch's own CMake link interface: {', '.join(sorted(from_torch)) or 'none'})")


def cmd_selftest(bundle):
    bundle = os.path.realpath(bundle)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.cc")
        with open(src, "w") as f:
            f.write('#include "absl/strings/str_cat.h"\n#include <nlohmann/json.hpp>\n')

        def deps(extra):
            r = subprocess.run(["c++", "-std=c++17", "-M", *extra, src], capture_output=True,
                               text=True)
            if r.returncode != 0:
                return None
            text = r.stdout.replace("\\\n", " ")
            return {os.path.normpath(t) for t in text.split(":", 1)[1].split()} - {src}

        leaky = deps([])
        clean = deps(["-isystem", os.path.join(bundle, "usr", "include")])
        if clean is None:
            fail("the probe does not compile against the bundle alone")
        _, v_clean = classify(clean, bundle, [tmp])
        if v_clean:
            fail("selftest: the probe against the bundle read system headers", v_clean)
        if leaky is None:
            print("gpu-bundle-check: selftest: this machine has no system Abseil/nlohmann-json "
                  "headers, so nothing can leak from there")
            return
        _, v_leaky = classify(leaky, bundle, [tmp])
        flagged = {v.split(" (")[1].rstrip(")") for v in v_leaky}
        if not {"libabsl-dev", "nlohmann-json3-dev"} <= flagged:
            fail("selftest: system copies were read but not flagged", sorted(flagged))
    print("gpu-bundle-check: selftest: OK (without the bundle the classifier flags "
          + ", ".join(sorted(flagged)) + "; with it, nothing)")


def main(argv):
    sys.stdout.reconfigure(line_buffering=True)
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    cmd = argv[1]
    if cmd == "selftest":
        cmd_selftest(argv[2])
    elif cmd == "cache":
        cmd_cache(argv[2], argv[3])
    elif cmd == "headers":
        cmd_headers(argv[2], argv[3])
    elif cmd == "link":
        args = argv[2:]
        torch_dir = None
        if args and args[0].startswith("--torch-dir="):
            torch_dir = args.pop(0).split("=", 1)[1]
        cmd_link(args[0], args[1], args[2:], torch_dir)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
"""Checks deploy/docker/Dockerfile without a Docker engine.

  check_dockerfile.py REPO_ROOT BUILD_DIR

- no `# syntax=` directive (it makes BuildKit pull a frontend image);
- the stages FROM ${BUILD_BASE} AS build, FROM scratch AS prebuilt (the
  binaries and examples of a build context), FROM ${BINARIES} AS binaries
  (BINARIES=build by default) and FROM ${RUNTIME_BASE} (the CPU bases by
  default); PIPETRAIN_CUDA as a build argument handed to CMake;
- the runtime stage runs as a non-root user and copies only the binaries
  (last, so a code change rebuilds only that layer), the examples and the
  list of runtime packages from the binaries stage;
- the build stage installs only packages deploy/setup.sh also installs (so
  the tested build is the imaged one), and the .dockerignore beside the
  Dockerfile keeps build trees out but nothing the build needs;
- the binary paths the build stage copies exist in a CMake build tree;
- runtime-packages.sh finds the packages of those binaries' libraries;
- CMake configures with the Dockerfile's options (tests and benchmarks off)
  and still has the four targets the image builds.
"""
import fnmatch
import os
import re
import shlex
import subprocess
import sys
import tempfile

problems = []


def fail(message):
    problems.append(message)


def instructions(path):
    """[(KEYWORD, text)] with continuations joined and comments dropped."""
    out, current = [], ""
    with open(path) as f:
        for line in f:
            stripped = line.strip()
            if not current and (not stripped or stripped.startswith("#")):
                continue
            if current and stripped.startswith("#"):
                continue
            if stripped.endswith("\\"):
                current += stripped[:-1] + " "
                continue
            current += stripped
            keyword, _, rest = current.partition(" ")
            out.append((keyword.upper(), rest.strip()))
            current = ""
    return out


def setup_packages(root):
    text = open(os.path.join(root, "deploy/setup.sh")).read()
    m = re.search(r"PACKAGES=\((.*?)\n\)", text, re.S)
    body = re.sub(r"#.*", "", m.group(1)) if m else ""
    return set(body.split())


def main(root, build_dir):
    dockerfile = os.path.join(root, "deploy/docker/Dockerfile")
    if re.search(r"^#\s*syntax\s*=", open(dockerfile).read(), re.M | re.I):
        fail("a `# syntax=` directive makes BuildKit pull a frontend (offline builds fail)")
    ins = instructions(dockerfile)
    froms = [i for i, (k, _) in enumerate(ins) if k == "FROM"]
    want_froms = ["${BUILD_BASE} AS build", "scratch AS prebuilt", "${BINARIES} AS binaries",
                  "${RUNTIME_BASE} AS runtime"]
    if [ins[i][1] for i in froms] != want_froms:
        fail(f"stages FROM {[ins[i][1] for i in froms]}, want {want_froms}")
        return
    global_args = dict(a.split("=", 1) for k, a in ins[:froms[0]] if k == "ARG" and "=" in a)
    if global_args.get("BUILD_BASE") != "debian:bookworm" or \
            global_args.get("RUNTIME_BASE") != "debian:bookworm-slim":
        fail(f"default bases {global_args}: want debian:bookworm and debian:bookworm-slim")
    if global_args.get("BINARIES") != "build":
        fail(f"ARG BINARIES defaults to {global_args.get('BINARIES')}, want build")
    build, prebuilt = ins[froms[0] + 1:froms[1]], ins[froms[1] + 1:froms[2]]
    runtime = ins[froms[3] + 1:]
    if froms[3] != froms[2] + 1:
        fail("the binaries stage does more than name the chosen stage")
    prebuilt_copies = sorted(a for k, a in prebuilt if k in ("COPY", "ADD", "RUN"))
    if prebuilt_copies != ["examples/ /src/examples/", "prebuilt/ /out/"]:
        fail(f"prebuilt stage: {prebuilt_copies}, want COPY prebuilt/ /out/ and examples/")

    # Build stage.
    build_args = dict((a.split("=", 1) + [""])[:2] for k, a in build if k == "ARG")
    if build_args.get("PIPETRAIN_CUDA") not in ("AUTO", "ON", "OFF"):
        fail("build stage: no ARG PIPETRAIN_CUDA (AUTO|ON|OFF)")
    runs = " ; ".join(a for k, a in build if k == "RUN")
    m = re.search(r"cmake -S \. -B (\S+)(.*?)(&&|$)", runs)
    if m is None:
        fail("build stage: no `cmake -S . -B DIR` configure step")
        return
    image_build_dir = m.group(1)
    options = [o.strip('"') for o in shlex.split(m.group(2)) if o.strip('"').startswith("-D")]
    if "-DPIPETRAIN_CUDA=${PIPETRAIN_CUDA}" not in options:
        fail(f"the configure step does not pass PIPETRAIN_CUDA: {options}")
    apt = re.search(r"apt-get install -y --no-install-recommends (.*?)&&", runs)
    wanted = set(apt.group(1).split()) if apt else set()
    extra = wanted - setup_packages(root)
    if not wanted or extra:
        fail(f"build stage installs packages deploy/setup.sh does not: {sorted(extra)}")
    targets = re.search(r"--target (.*?)&&", runs)
    targets = targets.group(1).split() if targets else []
    if set(targets) != {"pipetrain-scheduler", "pipetrain-worker", "pipetrainctl",
                        "pipetrain-train"}:
        fail(f"build stage builds {targets}")
    copied = re.findall(re.escape(image_build_dir) + r"/(\S+)", runs)
    binaries = [os.path.join(build_dir, c) for c in copied if "/" in c]
    for b in binaries:
        if not os.access(b, os.X_OK):
            fail(f"build stage copies {image_build_dir}/{os.path.relpath(b, build_dir)}, "
                 "which the CMake build does not produce")
    if len(binaries) != 4:
        fail(f"build stage copies {len(binaries)} binaries, want 4")

    # Runtime stage.
    users = [a for k, a in runtime if k == "USER"]
    if not users or users[-1].split(":")[0] in ("0", "root"):
        fail("runtime stage does not run as a non-root USER")
    copies = [a for k, a in runtime if k in ("COPY", "ADD")]
    if not copies or not copies[-1].startswith("--from=binaries /out/bin/"):
        fail("runtime stage: the binaries are not its last layer")
    for k, a in runtime:
        if k in ("COPY", "ADD"):
            if "--from=binaries" not in a:
                fail(f"runtime stage: {k} {a} does not come from the binaries stage")
                continue
            sources = shlex.split(a)[1:-1]
            for s in sources:
                if s.startswith("--"):
                    continue
                if not (s.startswith("/out/bin") or s.startswith("/src/examples") or
                        s.startswith("/out/lib") or
                        s == "/out/runtime-packages.txt"):
                    fail(f"runtime stage copies {s} (only binaries and examples belong)")
    exposed = {p for k, a in runtime if k == "EXPOSE" for p in a.split()}
    if exposed != {"7000", "8080", "7100", "9100"}:
        fail(f"EXPOSE {sorted(exposed)}, want 7000 8080 7100 9100")

    # .dockerignore
    ignore_file = dockerfile + ".dockerignore"
    patterns = [l.strip() for l in open(ignore_file) if l.strip() and not l.startswith("#")]

    def ignored(path):
        return any(fnmatch.fnmatch(path, p) for p in patterns)

    for path in (".git", ".tools", "build", "build-deploy"):
        if not ignored(path):
            fail(f".dockerignore lets {path} into the build context")
    top = open(os.path.join(root, "CMakeLists.txt")).read()
    needed = set(re.findall(r"add_subdirectory\((\w+)", top)) | {"cmake", "examples",
                                                                "CMakeLists.txt"}
    for path in sorted(needed):
        if ignored(path):
            fail(f".dockerignore leaves out {path}, which the build needs")

    # Runtime libraries of the binaries.
    out = subprocess.run(["bash", os.path.join(root, "deploy/docker/runtime-packages.sh")] +
                         binaries, capture_output=True, text=True)
    packages = out.stdout.split()
    if out.returncode != 0 or not any(p.startswith("libgrpc++") for p in packages):
        fail(f"runtime-packages.sh: rc {out.returncode}, {packages}\n{out.stderr}")
    if any(p.endswith("-dev") for p in packages):
        fail(f"runtime-packages.sh lists -dev packages: {packages}")

    # CMake configures with the image's options.
    values = {"PIPETRAIN_CUDA": "OFF",
              "CUDA_ARCHITECTURES": build_args.get("CUDA_ARCHITECTURES", "90")}
    resolved = [re.sub(r"\$\{(\w+)\}", lambda v: values.get(v.group(1), ""), o)
                for o in options]
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(["cmake", "-S", root, "-B", tmp, "-G", "Ninja"] + resolved,
                             capture_output=True, text=True)
        if out.returncode != 0:
            fail(f"cmake {' '.join(resolved)} failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
            return
        listed = subprocess.run(["ninja", "-C", tmp, "-t", "targets", "all"],
                                capture_output=True, text=True).stdout
        for t in targets:
            if not re.search(rf"(^|/){re.escape(t)}: ", listed, re.M):
                fail(f"with the image's options CMake has no target {t}")
        if re.search(r"_test: ", listed):
            fail("with the image's options CMake still builds tests")
    print(f"Dockerfile: {len(ins)} instructions, runtime packages: {' '.join(packages)}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    main(sys.argv[1], sys.argv[2])
    for p in problems:
        print(f"FAIL: {p}")
    print("OK" if not problems else f"{len(problems)} problem(s)")
    sys.exit(1 if problems else 0)

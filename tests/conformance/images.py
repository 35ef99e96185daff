#!/usr/bin/env python3
"""The test images of the e2e suite, as OCI layouts, for scripts/conformance.

Usage: tests/conformance/images.py OUT_DIR BIN_DIR NC
       tests/conformance/images.py --busybox FILE   (writes the images' busybox binary to FILE)

BIN_DIR holds the static `agnhost` and `nnp` binaries built from the k8s.io/kubernetes
module (test/images/agnhost, test/images/nonewprivs) and agnhost's `localhost.crt` and
`localhost.key` (test/images/agnhost/porter); NC is the static UDP-capable netcat of
tests/conformance/nc. Each image is an equivalent of the
upstream one under the name test/utils/image/manifest.go gives it, built with images/build's
layer writer on its busybox layer (Debian's busybox-static, whose shell keeps every environment
variable as upstream's does: keep_all_environment):

  e2e-test-images/agnhost:2.66.1, :2.55  busybox + /agnhost (+ /agnhost-2, /uploads,
                                         /localhost.crt and .key), a curl on busybox wget,
                                         an nc with -u, /bin/bash (busybox ash),
                                         user-defined-in-image (1000) / group 50000;
                                         ENTRYPOINT /agnhost, CMD pause (as upstream)
  pause:3.10.2                           the agnhost layers, ENTRYPOINT /agnhost pause
  e2e-test-images/busybox:1.37.0-2       busybox, CMD sh (also as glibc-dns-testing:2.1.1)
  e2e-test-images/nginx:1.27.0-2, 1.28.0-2  busybox; busybox httpd on port 80 in the foreground
  e2e-test-images/nonroot:1.5            busybox, USER 1234
  e2e-test-images/nonewprivs:1.4         busybox + setuid-root /usr/local/bin/nnp, CMD nnp

Prints one line per image: LAYOUT_DIR REPOSITORY:TAG (the part after the registry).
"""
import importlib.machinery
import importlib.util
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.join(os.path.dirname(os.path.dirname(HERE)), "images", "build")


# upstream's agnhost image has curl (alpine's); the suite runs `curl -g -q -s [-i] [-o FILE]
# [-w %{http_code}] [--max-time N] [--connect-timeout N] URL` in it. This is that subset on
# busybox wget.
CURL = rb"""#!/bin/sh
# curl, the subset of its options the e2e suite uses, on busybox wget (tests/conformance/images.py)
out=- fmt= timeout= headers= url=
while [ $# -gt 0 ]; do
  case "$1" in
    -o) out=$2; shift ;;
    -w) fmt=$2; shift ;;
    -m|--max-time) timeout=$2; shift ;;
    --connect-timeout) shift ;;
    -i) headers=1 ;;
    -*) ;;
    *) url=$1 ;;
  esac
  shift
done
err=$(mktemp)
# busybox 1.35's wget -T crashes (SIGSEGV) on this machine's kernel: timeout(1) instead
limit() { if [ -n "$timeout" ]; then timeout "$timeout" "$@"; else "$@"; fi; }
if [ -n "$headers" ] && [ "$out" = - ]; then
  body=$(limit wget -S -q -O - "$url" 2>"$err"); rc=$?
  sed -n 's/^  //p' "$err"; echo; printf '%s' "$body"
else
  limit wget -S -q -O "$out" "$url" 2>"$err"; rc=$?
fi
code=$(sed -n 's/.*HTTP\/[0-9.]* \([0-9][0-9][0-9]\).*/\1/p' "$err" | tail -n 1)
rm -f "$err"
[ -n "$fmt" ] && printf '%s' "$(printf '%s' "$fmt" | sed "s/%{http_code}/${code:-000}/")"
[ -n "$code" ] && exit 0
exit 7
"""


# upstream's agnhost image has bash (specs run `/bin/bash -c SCRIPT`); their scripts are
# POSIX shell with `trap _term SIGTERM`, which busybox ash runs as well.
BASH = b"""#!/bin/sh
# bash for the e2e suite's scripts: busybox ash (tests/conformance/images.py)
exec /bin/sh "$@"
"""


# Upstream's busybox image (Docker's busybox:1.37.0, from busybox's own source) keeps
# environment variables whose names are not shell names (`data-1`, `p-data-1`: ConfigMap
# and Secret keys through envFrom): ash imports every `NAME=value` entry of its environment
# (busybox commit 9c143ce52, 1.28: "ash: retain envvars with bad names in initial
# environment"), so `sh -c env` prints them. Debian's busybox and busybox-static 1.35 do
# not: their ash's environment import has the check from before that commit, `p =
# endofname(entry); if (p != entry && *p == '=') setvareq(entry, VEXPORT|VTEXTFIXED)`
# (seen in their machine code; busybox 1.35.0 built from its source keeps the variables),
# so such variables vanish in the shell and in everything it starts. The stand-ins' copy
# of busybox gets upstream's import back: the two conditional jumps of that check become
# two-byte NOPs. What still differs from upstream: an environment entry without `=` (which
# no container runtime sets) is imported as an empty variable, where upstream skips it; and
# `export -p` / `set` print such a variable whole (`export data-1='x'`), as Debian's ash
# also has that commit's other half undone, where upstream prints the name up to the first
# character that is not a name's. Anything but exactly one match (another Debian build) fails
# the build.
ENV_IMPORT = re.compile(
    rb"\xe8....\x48\x8b\x3b\x48\x39\xc7(\x74.)\x80\x38\x3d(\x75.)\xbe\x09\x00\x00\x00\xe8",
    re.S)
NOP2 = b"\x66\x90"


def keep_all_environment(busybox):
    """Debian's busybox binary with ash importing every environment variable, as upstream."""
    matches = list(ENV_IMPORT.finditer(busybox))
    if len(matches) != 1:
        sys.exit(f"images.py: found ash's environment import check {len(matches)} times in "
                 "busybox, not once (busybox changed? see keep_all_environment)")
    m = matches[0]
    patched = bytearray(busybox)
    for group in (1, 2):
        patched[m.start(group):m.end(group)] = NOP2
    return bytes(patched)


def load_build():
    loader = importlib.machinery.SourceFileLoader("images_build", BUILD)
    spec = importlib.util.spec_from_loader("images_build", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--busybox":
        # the images' busybox alone, for the test that its shell keeps every variable
        # (tests/tests/conformance_images.rs)
        kind, mode, busybox = load_build().busybox_layer().entries["bin/busybox"]
        with open(sys.argv[2], "wb") as f:
            f.write(keep_all_environment(busybox))
        os.chmod(sys.argv[2], 0o755)
        return
    if len(sys.argv) != 4:
        sys.exit("usage: images.py OUT_DIR BIN_DIR NC | --busybox FILE")
    out, bins, nc = (os.path.abspath(a) for a in sys.argv[1:])
    b = load_build()
    os.makedirs(out, exist_ok=True)

    base = b.busybox_layer()
    kind, mode, busybox = base.entries["bin/busybox"]
    base.entries["bin/busybox"] = (kind, mode, keep_all_environment(busybox))
    # upstream's agnhost image adds this user and group (alpine's adduser/addgroup), and has
    # no other uid / gid 1000: the base's `app` would be the name of uid 1000 (the first
    # entry wins) and hide the user's membership of group 50000.
    def without_id_1000(text):
        return b"".join(l for l in text.splitlines(True) if l.split(b":")[2:3] != [b"1000"])

    passwd = without_id_1000(base.entries["etc/passwd"][2]) \
        + b"user-defined-in-image:x:1000:1000::/home/app:/bin/sh\n"
    group = without_id_1000(base.entries["etc/group"][2]) \
        + b"user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n"
    agnhost = b.Layer()
    agnhost.dir("etc")
    agnhost.file("etc/passwd", passwd)
    agnhost.file("etc/group", group)
    agnhost.file("agnhost", open(os.path.join(bins, "agnhost"), "rb").read(), 0o755)
    agnhost.symlink("agnhost-2", "agnhost")
    agnhost.dir("uploads")
    for d in ["usr", "usr/local", "usr/local/bin"]:
        agnhost.dir(d)
    agnhost.file("usr/local/bin/curl", CURL, 0o755)
    # Debian's busybox-static shell runs its own applets before anything on PATH, so its
    # nc applet is renamed nd in this image's copy: `nc` is then tests/conformance/nc,
    # which hands what is not UDP to the applet under its new name.
    applets = base.entries["bin/busybox"][2]
    renamed = applets.replace(b"\0nameif\0nc\0netstat\0", b"\0nameif\0nd\0netstat\0")
    if renamed.count(b"\0nameif\0nd\0netstat\0") != 1:
        sys.exit("images.py: cannot find busybox's nc applet to rename (busybox changed?)")
    agnhost.dir("bin")
    agnhost.file("bin/busybox", renamed, 0o755)
    agnhost.file("usr/local/bin/nc", open(nc, "rb").read(), 0o755)
    agnhost.file("bin/bash", BASH, 0o755)
    # the TLS pair of agnhost's porter, which HTTPS probes and hooks serve with
    for name in ["localhost.crt", "localhost.key"]:
        agnhost.file(name, open(os.path.join(bins, name), "rb").read())
    nnp = b.Layer()
    for d in ["usr", "usr/local", "usr/local/bin"]:
        nnp.dir(d)
    nnp.file("usr/local/bin/nnp", open(os.path.join(bins, "nnp"), "rb").read(), 0o4755)

    def config(**kw):
        c = {"Env": b.ENV, "WorkingDir": "/"}
        c.update(kw)
        return c

    images = [
        ("agnhost", [base, agnhost], config(Entrypoint=["/agnhost"], Cmd=["pause"]),
         ["e2e-test-images/agnhost:2.66.1", "e2e-test-images/agnhost:2.55"]),
        ("pause", [base, agnhost], config(Entrypoint=["/agnhost", "pause"]), ["pause:3.10.2"]),
        # glibc-dns-testing: the hostnameOverride specs run `hostname -f`, which busybox
        # answers from /etc/hosts as glibc does
        ("busybox", [base], config(Cmd=["sh"]),
         ["e2e-test-images/busybox:1.37.0-2", "e2e-test-images/glibc-dns-testing:2.1.1"]),
        ("nginx", [base], config(Cmd=["httpd", "-f", "-p", "80", "-h", "/var/www"]),
         ["e2e-test-images/nginx:1.27.0-2", "e2e-test-images/nginx:1.28.0-2"]),
        ("nonroot", [base], config(Cmd=["sh"], User="1234"), ["e2e-test-images/nonroot:1.5"]),
        ("nonewprivs", [base, nnp], config(Cmd=["nnp"]), ["e2e-test-images/nonewprivs:1.4"]),
    ]
    for name, layers, cfg, refs in images:
        layout = os.path.join(out, name)
        b.build_image(out, name, layers, config=cfg, archives=False)
        for ref in refs:
            print(layout, ref)


if __name__ == "__main__":
    main()

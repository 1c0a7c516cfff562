"""Agents of the allow-list sandbox tests (`test_sandbox_root.py`), run as a session's harness with
`python -c CODE TARGETS_JSON`:

- `WALK` walks the whole visible file system (not /proc, /sys, /dev) for what an agent could use: files
  that hold an answer or a secret (the markers in TARGETS: a gold patch, a token, a TLS key, a store's
  nonce, each searched in every readable file up to 4 MB), files named like a task set, a store, a shadow
  file or an SSH host key (key files by name would be the public test fixtures of installed packages), and
  Unix sockets it can connect to. It prints {"hits": [...], "sockets": [...], "files": n}.
- `PROBE` tries each finding of the security review one by one and prints what it got: /etc/shadow, a
  hidden secret file, a socket outside, nested user namespaces, syscalls the seccomp filter denies (their
  errno), a setuid copy of `id` in the workspace, pid 1's command line, its cgroup and its limits, and how
  many of TARGETS' `spawn` processes it could start.
"""

from __future__ import annotations

WALK = r"""
import json, os, socket, stat, sys
targets = json.loads(sys.argv[1])
markers = [marker.encode() for marker in targets["markers"]]
names = ("tasks.jsonl", "rollout.sqlite", "capture.sqlite", "shadow", "gshadow")
hits, sockets, files = [], [], 0
for top, dirs, entries in os.walk("/"):
    if top == "/":
        dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev")]
    for name in entries:
        path = os.path.join(top, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISSOCK(info.st_mode):
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(1)
                try:
                    s.connect(path)
                    sockets.append(path)
                except OSError:
                    pass
            continue
        if not stat.S_ISREG(info.st_mode):
            continue
        files += 1
        if name in names or name.startswith("ssh_host_"):
            if os.access(path, os.R_OK):
                hits.append(["name", path])
        if info.st_size > 4 << 20:
            continue
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except OSError:
            continue
        for marker in markers:
            if marker in data:
                hits.append(["content", path])
print(json.dumps({"hits": hits, "sockets": sockets, "files": files}))
"""

PROBE = r"""
import ctypes, json, os, shutil, socket, subprocess, sys
targets = json.loads(sys.argv[1])
found = {}

def attempt(name, action):
    try:
        found[name] = action()
    except Exception as error:
        found[name] = "error: " + type(error).__name__

def read(path):
    with open(path, "rb") as handle:
        return len(handle.read()) > 0

def connect(path):
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(2)
        s.connect(path)
        return True

def nested_userns():
    run = subprocess.run(["unshare", "-Urnm", "sh", "-c", "mount -t tmpfs none /mnt && echo mounted"],
                         capture_output=True, text=True, timeout=10)
    return run.returncode == 0 and "mounted" in run.stdout

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
buffer = ctypes.create_string_buffer(256)

def call(number, *args):
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    return 0 if result >= 0 else ctypes.get_errno()

def perf_attr():
    attr = ctypes.create_string_buffer(128)
    attr[4:8] = (128).to_bytes(4, "little")                    # size; type 0 = PERF_TYPE_HARDWARE... use software
    attr[0:4] = (1).to_bytes(4, "little")                      # PERF_TYPE_SOFTWARE
    attr[40:48] = ((1 << 5) | (1 << 6)).to_bytes(8, "little")  # exclude_kernel, exclude_hv
    return attr

syscalls = {  # x86_64 numbers: name -> (number, args)
    "keyctl": (250, (0, -3, 1)),                    # KEYCTL_GET_KEYRING_ID of the session keyring
    "add_key": (248, (ctypes.c_char_p(b"user"), ctypes.c_char_p(b"lodestar"), ctypes.c_char_p(b"x"), 1, -3)),
    "io_uring_setup": (425, (1, buffer)),
    "userfaultfd": (323, (1,)),                     # UFFD_USER_MODE_ONLY
    "perf_event_open": (298, (perf_attr(), 0, -1, -1, 0)),
    "personality": (135, (0x0400000,)),             # READ_IMPLIES_EXEC
    "unshare": (272, (0x00020000,)),                # CLONE_NEWNS
    "mount": (165, (ctypes.c_char_p(b"none"), ctypes.c_char_p(b"/tmp"), ctypes.c_char_p(b"tmpfs"), 0, None)),
    "bpf": (321, (0, buffer, 72)),
}
attempt("shadow", lambda: read("/etc/shadow"))
attempt("ssh_host_keys", lambda: any(read(os.path.join("/etc/ssh", n)) for n in os.listdir("/etc/ssh")
                                     if n.startswith("ssh_host_") and n.endswith("_key")))
attempt("hidden_file", lambda: read(targets["hidden_file"]))
attempt("openssl_cnf", lambda: read("/etc/ssl/openssl.cnf"))  # node.js reads it at start
attempt("socket", lambda: connect(targets["socket"]))
attempt("nested_userns", nested_userns)
found["syscalls"] = {name: call(number, *args) for name, (number, args) in syscalls.items()}
shutil.copy("/usr/bin/id", "suid-id")
os.chmod("suid-id", 0o4755)
found["pid1_cmdline"] = open("/proc/1/cmdline", "rb").read().decode(errors="replace")
found["cgroup"] = open("/proc/self/cgroup").read()
found["limits"] = open("/proc/self/limits").read()
started = []
for _ in range(targets.get("spawn", 0)):
    try:
        started.append(subprocess.Popen(["sleep", "30"]))
    except OSError:
        break
found["spawned"] = len(started)
for process in started:
    process.kill()
    process.wait()
print(json.dumps(found))
"""

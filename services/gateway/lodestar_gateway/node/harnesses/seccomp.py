"""The session sandbox's seccomp filter: a classic-BPF program (what `bwrap --seccomp FD` loads) that makes the
kernel interfaces a session has no use for fail with EPERM.

A deny-list, with Docker's default profile as the reference for what is on it: the syscalls that profile
leaves out (or allows only with a capability a session never has) and that are a kernel attack surface or
reach beyond the session: keyrings (`add_key`, `keyctl`, `request_key`), `bpf`, `perf_event_open`,
`userfaultfd`, `io_uring_*`, every mount and namespace call (`mount`, `umount2`, `pivot_root`, the new mount
API, `unshare`, `setns`), `kexec_*`, `*_module`, clocks, `reboot`, `swapon`, `acct`, `quotactl`, `syslog`,
file handles (`open_by_handle_at`), `kcmp`, `ioperm`/`iopl`, `uselib` and friends; `personality` only with
the values Docker allows; `ioctl(TIOCSTI/TIOCLINUX)` (typing into a terminal). Any other architecture's
calling convention (32-bit compat, x32) is refused whole, so a call cannot be made under another number.

Why a deny-list and not Docker's allow-list: sessions run arbitrary toolchains (node, Python, compilers,
test suites) on the node's own kernel, and an allow-list that is wrong breaks them with EPERM in ways that
look like agent failures; the calls denied here are the ones behind container escapes and kernel exploits.
What it does not stop: a syscall added to the kernel later is allowed until it is listed here.

x86_64 and aarch64; on any other machine `program()` raises (the sandbox then refuses sessions).
"""

from __future__ import annotations

import errno
import platform
import struct

_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_X32_BIT = 0x40000000
_OFFSET_NR = 0
_OFFSET_ARCH = 4
_OFFSET_ARG0 = 16
_OFFSET_ARG1 = 24

# Kept as laid out (the skip below): a table of syscall names; one per line would be 55 lines.
_DENIED = (
    "acct", "add_key", "bpf", "clock_adjtime", "clock_settime", "delete_module", "finit_module", "init_module",
    "create_module", "get_kernel_syms", "query_module", "ioperm", "iopl", "kcmp", "kexec_file_load",
    "kexec_load", "keyctl", "lookup_dcookie", "mount", "umount2", "move_mount", "open_tree", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr", "name_to_handle_at", "open_by_handle_at", "nfsservctl",
    "perf_event_open", "pivot_root", "quotactl", "quotactl_fd", "reboot", "request_key", "setns",
    "settimeofday", "swapon", "swapoff", "sysfs", "_sysctl", "unshare", "uselib", "userfaultfd", "ustat",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "syslog", "fanotify_init",
)  # fmt: skip
"""Denied with EPERM (names a machine does not have are skipped)."""

_PERSONALITY_ALLOWED = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)
"""personality(2) values Docker's default profile allows (Linux, 32-bit uname, UNAME26, query)."""
_IOCTL_DENIED = (0x5412, 0x541C)
"""TIOCSTI, TIOCLINUX."""

# Kept as laid out (the skips below): syscall numbers per architecture (name: number), packed as a table.
_X86_64 = {
    "acct": 163, "add_key": 248, "bpf": 321, "clock_adjtime": 305, "clock_settime": 227, "delete_module": 176,
    "finit_module": 313, "init_module": 175, "create_module": 174, "get_kernel_syms": 177, "query_module": 178,
    "ioperm": 173, "iopl": 172, "kcmp": 312, "kexec_file_load": 320, "kexec_load": 246, "keyctl": 250,
    "lookup_dcookie": 212, "mount": 165, "umount2": 166, "move_mount": 429, "open_tree": 428, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442, "name_to_handle_at": 303,
    "open_by_handle_at": 304, "nfsservctl": 180, "perf_event_open": 298, "pivot_root": 155, "quotactl": 179,
    "quotactl_fd": 443, "reboot": 169, "request_key": 249, "setns": 308, "settimeofday": 164, "swapon": 167,
    "swapoff": 168, "sysfs": 139, "_sysctl": 156, "unshare": 272, "uselib": 134, "userfaultfd": 323,
    "ustat": 136, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "syslog": 103,
    "fanotify_init": 300, "personality": 135, "ioctl": 16,
}  # fmt: skip
_AARCH64 = {
    "acct": 89, "add_key": 217, "bpf": 280, "clock_adjtime": 266, "clock_settime": 112, "delete_module": 106,
    "finit_module": 273, "init_module": 105, "kcmp": 272, "kexec_file_load": 294, "kexec_load": 104,
    "keyctl": 219, "lookup_dcookie": 18, "mount": 40, "umount2": 39, "move_mount": 429, "open_tree": 428,
    "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
    "name_to_handle_at": 264, "open_by_handle_at": 265, "nfsservctl": 42, "perf_event_open": 241,
    "pivot_root": 41, "quotactl": 60, "quotactl_fd": 443, "reboot": 142, "request_key": 218, "setns": 268,
    "settimeofday": 170, "swapon": 224, "swapoff": 225, "unshare": 97, "userfaultfd": 282,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "syslog": 116, "fanotify_init": 262,
    "personality": 92, "ioctl": 29,
}  # fmt: skip
_ARCHES = {"x86_64": (0xC000003E, _X86_64), "aarch64": (0xC00000B7, _AARCH64)}
"""machine -> (AUDIT_ARCH_* value, syscall numbers)."""


class _Program:
    """Instructions with symbolic jump targets ("deny", "allow"), resolved by `assemble`."""

    def __init__(self) -> None:
        self.code: list[tuple[int, int | str, int | str, int]] = []

    def op(self, code: int, k: int, jt: int | str = 0, jf: int | str = 0) -> None:
        self.code.append((code, jt, jf, k))

    def assemble(self) -> bytes:
        allow, deny = len(self.code), len(self.code) + 1  # what falls through the last check is allowed
        self.op(_RET_K, _RET_ALLOW)
        self.op(_RET_K, _RET_ERRNO | errno.EPERM)
        out = bytearray()
        for index, (code, jt, jf, k) in enumerate(self.code):
            offsets = []
            for target in (jt, jf):
                offset = target if isinstance(target, int) else {"deny": deny, "allow": allow}[target] - index - 1
                if not 0 <= offset <= 255:
                    raise ValueError(f"seccomp: jump of {offset} at instruction {index}")
                offsets.append(offset)
            out += struct.pack("=HBBI", code, offsets[0], offsets[1], k)
        return bytes(out)


def program(machine: str | None = None) -> bytes:
    """The filter for `machine` (default: this one's) as `struct sock_filter[]` bytes; ValueError when the
    machine has no syscall table here."""
    name = machine or platform.machine()
    if name not in _ARCHES:
        raise ValueError(f"no seccomp syscall table for {name} (known: {', '.join(sorted(_ARCHES))})")
    audit_arch, numbers = _ARCHES[name]
    prog = _Program()
    prog.op(_LD_W_ABS, _OFFSET_ARCH)
    prog.op(_JEQ_K, audit_arch, 1, 0)
    prog.op(_RET_K, _RET_ERRNO | errno.EPERM)  # another ABI (32-bit compat): nothing
    prog.op(_LD_W_ABS, _OFFSET_NR)
    if name == "x86_64":
        prog.op(_JSET_K, _X32_BIT, "deny", 0)
    for syscall in _DENIED:
        if syscall in numbers:
            prog.op(_JEQ_K, numbers[syscall], "deny", 0)
    _argument_checks(prog, numbers)
    return prog.assemble()


def _argument_checks(prog: _Program, numbers: dict[str, int]) -> None:
    """personality: only Docker's values; ioctl: not TIOCSTI/TIOCLINUX (the low 32 bits of the argument)."""
    allowed = len(_PERSONALITY_ALLOWED)
    prog.op(_JEQ_K, numbers["personality"], 0, allowed + 2)
    prog.op(_LD_W_ABS, _OFFSET_ARG0)
    for value in _PERSONALITY_ALLOWED:
        prog.op(_JEQ_K, value, "allow", 0)
    prog.op(_RET_K, _RET_ERRNO | errno.EPERM)
    prog.op(_JEQ_K, numbers["ioctl"], 0, "allow")
    prog.op(_LD_W_ABS, _OFFSET_ARG1)
    for request in _IOCTL_DENIED:
        prog.op(_JEQ_K, request, "deny", 0)

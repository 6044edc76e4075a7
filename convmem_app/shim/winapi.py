"""The few Windows API calls the shim makes, through `ctypes` (standard library only).

Imported only on Windows, and only when needed: each function here is one OS call (or a short
fixed sequence of them) with no decisions of its own; the decisions live in
`convmem_app.shim.launcher`, which is tested on every platform with these calls replaced. The
real calls are proved by the tests marked `windows` (ci.yml's Windows jobs).
"""

from __future__ import annotations

import ctypes
import sys
from ctypes import wintypes

if sys.platform != "win32":  # pragma: no cover - guarded by every caller
    raise ImportError("convmem_app.shim.winapi is for Windows only")

_kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined,unused-ignore]
_advapi32 = ctypes.WinDLL("advapi32", use_last_error=True)  # type: ignore[attr-defined,unused-ignore]

PROCESS_QUERY_LIMITED_INFORMATION = 0x1000
TOKEN_QUERY = 0x0008
TOKEN_USER_CLASS = 1  # TOKEN_INFORMATION_CLASS.TokenUser
STILL_ACTIVE = 259
ERROR_INSUFFICIENT_BUFFER = 122
APPMODEL_ERROR_NO_PACKAGE = 15700

_kernel32.GetCurrentProcess.restype = wintypes.HANDLE
_kernel32.OpenProcess.argtypes = [wintypes.DWORD, wintypes.BOOL, wintypes.DWORD]
_kernel32.OpenProcess.restype = wintypes.HANDLE
_kernel32.CloseHandle.argtypes = [wintypes.HANDLE]
_kernel32.GetNamedPipeServerProcessId.argtypes = [wintypes.HANDLE, ctypes.POINTER(wintypes.ULONG)]
_kernel32.GetExitCodeProcess.argtypes = [wintypes.HANDLE, ctypes.POINTER(wintypes.DWORD)]
_kernel32.LocalFree.argtypes = [wintypes.HLOCAL]
_kernel32.GetSystemDirectoryW.argtypes = [wintypes.LPWSTR, wintypes.UINT]
_kernel32.GetSystemDirectoryW.restype = wintypes.UINT
_advapi32.OpenProcessToken.argtypes = [
    wintypes.HANDLE,
    wintypes.DWORD,
    ctypes.POINTER(wintypes.HANDLE),
]
_advapi32.GetTokenInformation.argtypes = [
    wintypes.HANDLE,
    ctypes.c_int,
    ctypes.c_void_p,
    wintypes.DWORD,
    ctypes.POINTER(wintypes.DWORD),
]
_advapi32.ConvertSidToStringSidW.argtypes = [ctypes.c_void_p, ctypes.POINTER(wintypes.LPWSTR)]


def _error() -> OSError:
    return ctypes.WinError(ctypes.get_last_error())  # type: ignore[attr-defined,unused-ignore]


def pipe_server_pid(handle: int) -> int:
    """The process id of the server end of a connected named pipe."""
    pid = wintypes.ULONG()
    if not _kernel32.GetNamedPipeServerProcessId(wintypes.HANDLE(handle), ctypes.byref(pid)):
        raise _error()
    return int(pid.value)


def process_user_sid(pid: int | None = None) -> str:
    """The user SID (`S-1-5-21-...`) of the process `pid`'s token; ours when `pid` is None."""
    if pid is None:
        process = _kernel32.GetCurrentProcess()  # a pseudo handle: nothing to close
    else:
        process = _kernel32.OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, False, pid)
        if not process:
            raise _error()
    token = wintypes.HANDLE()
    try:
        if not _advapi32.OpenProcessToken(process, TOKEN_QUERY, ctypes.byref(token)):
            raise _error()
        size = wintypes.DWORD()
        _advapi32.GetTokenInformation(token, TOKEN_USER_CLASS, None, 0, ctypes.byref(size))
        buffer = ctypes.create_string_buffer(size.value)
        if not _advapi32.GetTokenInformation(
            token, TOKEN_USER_CLASS, buffer, size, ctypes.byref(size)
        ):
            raise _error()
        # TOKEN_USER = { SID_AND_ATTRIBUTES User = { PSID Sid; DWORD Attributes } }
        sid = ctypes.cast(buffer, ctypes.POINTER(ctypes.c_void_p))[0]
        text = wintypes.LPWSTR()
        if not _advapi32.ConvertSidToStringSidW(sid, ctypes.byref(text)):
            raise _error()
        try:
            return str(text.value)
        finally:
            _kernel32.LocalFree(ctypes.cast(text, wintypes.HLOCAL))
    finally:
        if token:
            _kernel32.CloseHandle(token)
        if pid is not None:
            _kernel32.CloseHandle(process)


def current_package_full_name() -> str | None:
    """This process's package identity (`Name_Version_Arch__PublisherId`): set when we run
    inside an MSIX package's context, which children of a packaged app inherit; else None."""
    get = getattr(_kernel32, "GetCurrentPackageFullName", None)
    if get is None:  # before Windows 8: no packages
        return None
    length = wintypes.UINT(0)
    status = get(ctypes.byref(length), None)
    if status != ERROR_INSUFFICIENT_BUFFER:  # APPMODEL_ERROR_NO_PACKAGE: not packaged
        return None
    buffer = ctypes.create_unicode_buffer(length.value)
    if get(ctypes.byref(length), buffer) != 0:
        return None
    return str(buffer.value) or None


def open_process(pid: int) -> int | None:
    """A handle on process `pid` that keeps its exit status readable after it ends (None when
    it is already gone or may not be opened). Never closed: the shim is short-lived."""
    handle = _kernel32.OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, False, pid)
    return int(handle) if handle else None


def exit_code(handle: int) -> int | None:
    """None while the process runs (or when it cannot be asked), else its exit status."""
    code = wintypes.DWORD()
    if not _kernel32.GetExitCodeProcess(wintypes.HANDLE(handle), ctypes.byref(code)):
        return None
    return None if code.value == STILL_ACTIVE else int(code.value)


def system_directory() -> str:
    """`C:\\Windows\\System32`, from the API (a packaged host may hand us an empty WINDIR)."""
    buffer = ctypes.create_unicode_buffer(260)
    length = _kernel32.GetSystemDirectoryW(buffer, len(buffer))
    if not length:
        raise _error()
    return str(buffer.value)

"""Windows: is the data dir private? Its owner and the write permissions in its DACL.

POSIX has the owner and mode bits (`fs.check_private_dir`); on Windows the same questions are
answered by the security descriptor (GetNamedSecurityInfoW): the owner must be the current user
(or SYSTEM / the Administrators group, as for folders an elevated installer made), and no ACE
that allows access may grant a write right (add a file or folder, delete a child, change the
permissions or the owner, generic write/all) to anyone but the user, SYSTEM, Administrators or
CREATOR OWNER. Inherit-only ACEs count too: they would apply to the files created inside.
A NULL DACL (everyone may do everything) is refused.
"""

from __future__ import annotations

import sys

# Rights that let someone else plant, replace or delete files in the folder, or take it over.
WRITE_RIGHTS = (
    0x0002  # FILE_ADD_FILE
    | 0x0004  # FILE_ADD_SUBDIRECTORY
    | 0x0040  # FILE_DELETE_CHILD
    | 0x00010000  # DELETE
    | 0x00040000  # WRITE_DAC
    | 0x00080000  # WRITE_OWNER
    | 0x10000000  # GENERIC_ALL
    | 0x40000000  # GENERIC_WRITE
)
TRUSTED_SIDS = ("S-1-5-18", "S-1-5-32-544", "S-1-3-0")  # SYSTEM, Administrators, CREATOR OWNER


if sys.platform != "win32":

    def dir_problem(path: str) -> str:
        """Empty when `path` is private to the current user, else what is wrong."""
        return ""

else:
    import ctypes
    from ctypes import wintypes

    _advapi32 = ctypes.WinDLL("advapi32", use_last_error=True)
    _kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)

    _SE_FILE_OBJECT = 1
    _OWNER_SECURITY_INFORMATION = 0x1
    _DACL_SECURITY_INFORMATION = 0x4
    _TOKEN_QUERY = 0x8
    _TOKEN_USER = 1
    _ACCESS_ALLOWED_ACE_TYPE = 0

    class _AclHeader(ctypes.Structure):
        _fields_ = [
            ("AclRevision", wintypes.BYTE),
            ("Sbz1", wintypes.BYTE),
            ("AclSize", wintypes.WORD),
            ("AceCount", wintypes.WORD),
            ("Sbz2", wintypes.WORD),
        ]

    class _AceHeader(ctypes.Structure):
        _fields_ = [
            ("AceType", wintypes.BYTE),
            ("AceFlags", wintypes.BYTE),
            ("AceSize", wintypes.WORD),
        ]

    class _AccessAllowedAce(ctypes.Structure):
        _fields_ = [("Header", _AceHeader), ("Mask", wintypes.DWORD), ("SidStart", wintypes.DWORD)]

    _GetNamedSecurityInfoW = _advapi32.GetNamedSecurityInfoW
    _GetNamedSecurityInfoW.restype = wintypes.DWORD
    _GetNamedSecurityInfoW.argtypes = [
        wintypes.LPCWSTR,
        ctypes.c_int,
        wintypes.DWORD,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(ctypes.c_void_p),
    ]
    _ConvertSidToStringSidW = _advapi32.ConvertSidToStringSidW
    _ConvertSidToStringSidW.restype = wintypes.BOOL
    _ConvertSidToStringSidW.argtypes = [ctypes.c_void_p, ctypes.POINTER(wintypes.LPWSTR)]
    _GetAce = _advapi32.GetAce
    _GetAce.restype = wintypes.BOOL
    _GetAce.argtypes = [ctypes.c_void_p, wintypes.DWORD, ctypes.POINTER(ctypes.c_void_p)]
    _OpenProcessToken = _advapi32.OpenProcessToken
    _OpenProcessToken.restype = wintypes.BOOL
    _OpenProcessToken.argtypes = [wintypes.HANDLE, wintypes.DWORD, ctypes.POINTER(wintypes.HANDLE)]
    _GetTokenInformation = _advapi32.GetTokenInformation
    _GetTokenInformation.restype = wintypes.BOOL
    _GetTokenInformation.argtypes = [
        wintypes.HANDLE,
        ctypes.c_int,
        ctypes.c_void_p,
        wintypes.DWORD,
        ctypes.POINTER(wintypes.DWORD),
    ]
    _GetCurrentProcess = _kernel32.GetCurrentProcess
    _GetCurrentProcess.restype = wintypes.HANDLE
    _CloseHandle = _kernel32.CloseHandle
    _CloseHandle.argtypes = [wintypes.HANDLE]
    _LocalFree = _kernel32.LocalFree
    _LocalFree.argtypes = [ctypes.c_void_p]

    def _sid_string(psid: int | None) -> str:
        out = wintypes.LPWSTR()
        if not psid or not _ConvertSidToStringSidW(psid, ctypes.byref(out)):
            raise ctypes.WinError(ctypes.get_last_error())
        try:
            return str(out.value)
        finally:
            _LocalFree(out)

    def _current_user_sid() -> str:
        token = wintypes.HANDLE()
        if not _OpenProcessToken(_GetCurrentProcess(), _TOKEN_QUERY, ctypes.byref(token)):
            raise ctypes.WinError(ctypes.get_last_error())
        try:
            needed = wintypes.DWORD()
            _GetTokenInformation(token, _TOKEN_USER, None, 0, ctypes.byref(needed))
            buf = ctypes.create_string_buffer(needed.value)
            if not _GetTokenInformation(token, _TOKEN_USER, buf, needed, ctypes.byref(needed)):
                raise ctypes.WinError(ctypes.get_last_error())
            # TOKEN_USER starts with SID_AND_ATTRIBUTES, whose first member is the PSID
            psid = ctypes.cast(buf, ctypes.POINTER(ctypes.c_void_p))[0]
            return _sid_string(psid)
        finally:
            _CloseHandle(token)

    def dir_problem(path: str) -> str:
        """ "" when `path` is private to the current user, else what is wrong (a message)."""
        owner = ctypes.c_void_p()
        dacl = ctypes.c_void_p()
        sd = ctypes.c_void_p()
        err = _GetNamedSecurityInfoW(
            path,
            _SE_FILE_OBJECT,
            _OWNER_SECURITY_INFORMATION | _DACL_SECURITY_INFORMATION,
            ctypes.byref(owner),
            None,
            ctypes.byref(dacl),
            None,
            ctypes.byref(sd),
        )
        if err:
            raise ctypes.WinError(err)
        try:
            me = _current_user_sid()
            owner_sid = _sid_string(owner.value)
            if owner_sid != me and owner_sid not in TRUSTED_SIDS:
                return (
                    f"is owned by another account ({owner_sid}; you are {me}): ConvMem keeps "
                    "memory only in a folder of your own; choose another data folder"
                )
            if not dacl.value:
                return (
                    "has no access control list (everyone may change it): another user could "
                    "plant or replace files in it; choose another data folder"
                )
            header = _AclHeader.from_address(dacl.value)
            for i in range(header.AceCount):
                pace = ctypes.c_void_p()
                if not _GetAce(dacl.value, i, ctypes.byref(pace)) or not pace.value:
                    raise ctypes.WinError(ctypes.get_last_error())
                ace = _AccessAllowedAce.from_address(pace.value)
                if ace.Header.AceType != _ACCESS_ALLOWED_ACE_TYPE or not ace.Mask & WRITE_RIGHTS:
                    continue
                sid = _sid_string(pace.value + _AccessAllowedAce.SidStart.offset)
                if sid != me and sid not in TRUSTED_SIDS:
                    return (
                        f"is writable by another account ({sid}): another user could plant or "
                        "replace files in it; remove that permission (folder Properties > "
                        "Security) or choose another data folder"
                    )
            return ""
        finally:
            _LocalFree(sd)

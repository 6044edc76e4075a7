; ConvMem per-user installer (NSIS 3.08 or later). No administrator rights: everything goes
; under the user's profile and HKCU.
;
;   makensis -WX [/DDIST=<folder>] [/DOUTFILE=<setup.exe>] [/DVERSION=x.y.z] installer\convmem.nsi
;
; DIST     the one-folder PyInstaller build (default ..\dist\ConvMem, relative to this file)
; OUTFILE  the installer to write (default ..\dist\ConvMem-<version>-setup.exe)
; VERSION  default: read from ..\pyproject.toml ([project] version, the file's first
;          `version = "..."` line); must be numeric x.y.z
; TARGET   NSIS stub, default x86-unicode (amd64-unicode was used to run it under 64-bit Wine)
;
; Signing: when CONVMEM_SIGN_PFX (a PKCS#12 file), CONVMEM_SIGN_THUMBPRINT (a certificate in
; the user's store, Windows only) or CONVMEM_SIGN_DLIB (a signtool plug-in such as Azure
; Artifact Signing's, Windows only) is set in the environment, `!finalize` signs the installer and
; `!uninstfinalize` signs the uninstaller before it is packed: installer\sign.ps1 when makensis
; runs on Windows, installer/sign.sh (osslsigncode) elsewhere. /DNOSIGN turns it off.
;
; What it does
; - installs into %LOCALAPPDATA%\Programs\ConvMem (changeable; never the data folder itself);
; - Start menu shortcut "ConvMem" (on by default);
; - "Start ConvMem when I sign in" (off by default): the same HKCU Run value `ConvMem` and the
;   same settings key the app's own "Start at login" menu item uses, so the tray shows it ticked;
; - an entry in Settings > Apps (HKCU), with an uninstaller that keeps the user's memories
;   (%LOCALAPPDATA%\ConvMem) and settings (%APPDATA%\ConvMem) unless the user ticks
;   "Also delete my memories and settings".
; - silent use: `setup.exe /S [/AUTOSTART] [/D=<folder>]`; `"Uninstall ConvMem.exe" /S
;   [/DELETEDATA]` (a silent uninstall keeps the memories unless /DELETEDATA is given).
; - refuses to overwrite or remove files while ConvMem, a shim or `convmem-cli` is running
;   (Windows keeps running executables locked) and asks the user to quit them first.

!ifdef TARGET
  Target ${TARGET}  ; e.g. amd64-unicode; the default x86-unicode stub runs on every Windows
!endif
Unicode true
ManifestDPIAware true
RequestExecutionLevel user
SetCompressor /SOLID lzma

!include "MUI2.nsh"
!include "LogicLib.nsh"
!include "FileFunc.nsh"

; ---- build-time settings -----------------------------------------------------------------------

!ifndef VERSION
  !searchparse /file "..\pyproject.toml" 'version = "' VERSION '"'
!endif
!searchparse /noerrors "${VERSION}" "" VERSION_MAJOR "." VERSION_MINOR "." VERSION_PATCH
!ifndef VERSION_PATCH
  !error "VERSION must look like x.y.z (got ${VERSION})"
!endif
!ifndef DIST
  !define DIST "..\dist\ConvMem"
!endif
!ifndef OUTFILE
  !define OUTFILE "..\dist\ConvMem-${VERSION}-setup.exe"
!endif

!define APP_NAME "ConvMem"
!define APP_EXE "ConvMem.exe"
!define CLI_EXE "convmem-cli.exe"
!define SHIM_EXE "convmem-shim.exe"
!define UNINSTALLER "Uninstall ConvMem.exe"
!define PUBLISHER "ConvMem"
!define UNINSTALL_KEY "Software\Microsoft\Windows\CurrentVersion\Uninstall\ConvMem"
!define APP_KEY "Software\ConvMem"
!define RUN_KEY "Software\Microsoft\Windows\CurrentVersion\Run"
!define RUN_VALUE "ConvMem"  ; convmem_app/autostart.py ENTRY_NAME

!if /FileExists "${DIST}\${APP_EXE}"
!else
  !error "${DIST}\${APP_EXE} not found: build the app first (pyinstaller installer\convmem.spec)"
!endif
!if /FileExists "${DIST}\${SHIM_EXE}"
!else
  !error "${DIST}\${SHIM_EXE} not found: build the app first (pyinstaller installer\convmem.spec)"
!endif

; Signing hooks. `$%NAME%` stays literally `$%NAME%` when NAME is not set.
!ifndef NOSIGN
  !if "$%CONVMEM_SIGN_PFX%" != "${U+24}%CONVMEM_SIGN_PFX%"
    !if "$%CONVMEM_SIGN_PFX%" != ""
      !define SIGN
    !endif
  !endif
  !if "$%CONVMEM_SIGN_THUMBPRINT%" != "${U+24}%CONVMEM_SIGN_THUMBPRINT%"
    !if "$%CONVMEM_SIGN_THUMBPRINT%" != ""
      !define /ifndef SIGN
    !endif
  !endif
  !if "$%CONVMEM_SIGN_DLIB%" != "${U+24}%CONVMEM_SIGN_DLIB%"
    !if "$%CONVMEM_SIGN_DLIB%" != ""
      !define /ifndef SIGN
    !endif
  !endif
!endif
; makensis runs in this file's folder (unless /NOCD), like every relative path here.
!ifdef SIGN
  !ifdef NSIS_WIN32_MAKENSIS
    !define SIGN_COMMAND 'powershell.exe -NoProfile -ExecutionPolicy Bypass -File ".\sign.ps1"'
    !define SIGN_SCRIPT "sign.ps1"
  !else
    !define SIGN_COMMAND 'sh ./sign.sh'
    !define SIGN_SCRIPT "sign.sh"
  !endif
  !if /FileExists "${SIGN_SCRIPT}"
  !else
    !error "${SIGN_SCRIPT} not found in the current folder: run makensis without /NOCD"
  !endif
  !finalize '${SIGN_COMMAND} "%1"' = 0
  !uninstfinalize '${SIGN_COMMAND} "%1"' = 0
!endif

Name "${APP_NAME}"
OutFile "${OUTFILE}"
InstallDir "$LOCALAPPDATA\Programs\${APP_NAME}"
InstallDirRegKey HKCU "${APP_KEY}" "InstallDir"
BrandingText "${APP_NAME} ${VERSION}"

VIProductVersion "${VERSION_MAJOR}.${VERSION_MINOR}.${VERSION_PATCH}.0"
VIFileVersion "${VERSION_MAJOR}.${VERSION_MINOR}.${VERSION_PATCH}.0"
VIAddVersionKey /LANG=1033 "ProductName" "${APP_NAME}"
VIAddVersionKey /LANG=1033 "ProductVersion" "${VERSION}"
VIAddVersionKey /LANG=1033 "FileVersion" "${VERSION}"
VIAddVersionKey /LANG=1033 "FileDescription" "${APP_NAME} ${VERSION} setup"
VIAddVersionKey /LANG=1033 "CompanyName" "${PUBLISHER}"
VIAddVersionKey /LANG=1033 "LegalCopyright" "${PUBLISHER}"

; ---- pages ---------------------------------------------------------------------------------------

!define MUI_ICON "..\resources\convmem.ico"
!define MUI_UNICON "..\resources\convmem.ico"
!define MUI_ABORTWARNING
!define MUI_COMPONENTSPAGE_NODESC
!define MUI_UNCOMPONENTSPAGE_NODESC
!define MUI_FINISHPAGE_RUN "$INSTDIR\${APP_EXE}"
!define MUI_FINISHPAGE_RUN_TEXT "Start ConvMem now"

!insertmacro MUI_PAGE_WELCOME
!insertmacro MUI_PAGE_COMPONENTS
!insertmacro MUI_PAGE_DIRECTORY
!insertmacro MUI_PAGE_INSTFILES
!insertmacro MUI_PAGE_FINISH

!insertmacro MUI_UNPAGE_CONFIRM
!insertmacro MUI_UNPAGE_COMPONENTS
!insertmacro MUI_UNPAGE_INSTFILES

!insertmacro MUI_LANGUAGE "English"

; ---- helpers ---------------------------------------------------------------------------------------

; Windows keeps a running executable locked: opening it for writing fails. Loop until the user
; has quit it (tray menu > Quit ConvMem; close the LLM hosts that run the shim) or cancels.
!macro WAIT_NOT_RUNNING FILE
  ${If} ${FileExists} "$INSTDIR\${FILE}"
    ${Do}
      ClearErrors
      FileOpen $0 "$INSTDIR\${FILE}" a
      ${IfNot} ${Errors}
        FileClose $0
        ${Break}
      ${EndIf}
      MessageBox MB_RETRYCANCEL|MB_ICONEXCLAMATION \
        "$INSTDIR\${FILE} is in use.$\r$\n$\r$\nQuit ConvMem (tray icon > Quit ConvMem) and close the LLM hosts that use it, then click Retry." \
        /SD IDCANCEL IDRETRY +2
      Abort "${FILE} is in use"
    ${Loop}
  ${EndIf}
!macroend

!macro WAIT_ALL_NOT_RUNNING
  !insertmacro WAIT_NOT_RUNNING "${APP_EXE}"
  !insertmacro WAIT_NOT_RUNNING "${SHIM_EXE}"
  !insertmacro WAIT_NOT_RUNNING "${CLI_EXE}"
!macroend

; ---- install -----------------------------------------------------------------------------------

Function .onVerifyInstDir
  ; The data folder is %LOCALAPPDATA%\ConvMem: installing into it would mix program and memories.
  ${If} $INSTDIR == "$LOCALAPPDATA\${APP_NAME}"
    Abort
  ${EndIf}
FunctionEnd

Section "ConvMem" SecMain
  SectionIn RO
  SetShellVarContext current
  ${If} $INSTDIR == "$LOCALAPPDATA\${APP_NAME}"  ; a silent /D= skips .onVerifyInstDir
    MessageBox MB_OK|MB_ICONSTOP "$INSTDIR holds your memories: choose another folder." /SD IDOK
    Abort "$INSTDIR is the data folder"
  ${EndIf}
  !insertmacro WAIT_ALL_NOT_RUNNING
  ; An update replaces the whole runtime: no stale libraries from an older build stay behind.
  RMDir /r "$INSTDIR\_internal"
  SetOutPath "$INSTDIR"
  File /r "${DIST}\*.*"
  WriteUninstaller "$INSTDIR\${UNINSTALLER}"

  WriteRegStr HKCU "${APP_KEY}" "InstallDir" "$INSTDIR"
  WriteRegStr HKCU "${UNINSTALL_KEY}" "DisplayName" "${APP_NAME}"
  WriteRegStr HKCU "${UNINSTALL_KEY}" "DisplayVersion" "${VERSION}"
  WriteRegStr HKCU "${UNINSTALL_KEY}" "Publisher" "${PUBLISHER}"
  WriteRegStr HKCU "${UNINSTALL_KEY}" "DisplayIcon" "$INSTDIR\${APP_EXE}"
  WriteRegStr HKCU "${UNINSTALL_KEY}" "InstallLocation" "$INSTDIR"
  WriteRegStr HKCU "${UNINSTALL_KEY}" "UninstallString" '"$INSTDIR\${UNINSTALLER}"'
  WriteRegStr HKCU "${UNINSTALL_KEY}" "QuietUninstallString" '"$INSTDIR\${UNINSTALLER}" /S'
  WriteRegDWORD HKCU "${UNINSTALL_KEY}" "NoModify" 1
  WriteRegDWORD HKCU "${UNINSTALL_KEY}" "NoRepair" 1
  ${GetSize} "$INSTDIR" "/S=0K" $0 $1 $2
  IntFmt $0 "0x%08X" $0
  WriteRegDWORD HKCU "${UNINSTALL_KEY}" "EstimatedSize" "$0"
SectionEnd

Section "Start menu shortcut" SecShortcut
  SetShellVarContext current
  CreateShortCut "$SMPROGRAMS\${APP_NAME}.lnk" "$INSTDIR\${APP_EXE}" "" "$INSTDIR\${APP_EXE}" 0 \
    SW_SHOWNORMAL "" "ConvMem: conversation memory for LLM hosts"
SectionEnd

Section /o "Start ConvMem when I sign in" SecAutostart
  SetShellVarContext current
  ; Without --data-dir the app uses CONVMEM_DATA_DIR, else %LOCALAPPDATA%\ConvMem.
  WriteRegStr HKCU "${RUN_KEY}" "${RUN_VALUE}" '"$INSTDIR\${APP_EXE}" --minimized'
  ; The app's settings (QSettings, INI format, user scope) remember the choice for its menu.
  CreateDirectory "$APPDATA\${APP_NAME}"
  WriteINIStr "$APPDATA\${APP_NAME}\${APP_NAME}.ini" "General" "startAtLogin" "true"
SectionEnd

; ---- uninstall ---------------------------------------------------------------------------------

Section "un.ConvMem" UnSecMain
  SectionIn RO
  SetShellVarContext current
  !insertmacro WAIT_ALL_NOT_RUNNING
  Delete "$SMPROGRAMS\${APP_NAME}.lnk"
  ; Only ConvMem writes this value (installer or the app's "Start at login").
  DeleteRegValue HKCU "${RUN_KEY}" "${RUN_VALUE}"
  RMDir /r "$INSTDIR\_internal"
  Delete "$INSTDIR\${APP_EXE}"
  Delete "$INSTDIR\${CLI_EXE}"
  Delete "$INSTDIR\${SHIM_EXE}"
  Delete "$INSTDIR\${UNINSTALLER}"
  RMDir "$INSTDIR"  ; only when empty: never files the user put there
  DeleteRegKey HKCU "${UNINSTALL_KEY}"
  DeleteRegKey HKCU "${APP_KEY}"
SectionEnd

Section /o "un.Also delete my memories and settings" UnSecData
  SetShellVarContext current
  ; The default data folder only: a folder chosen with --data-dir / CONVMEM_DATA_DIR stays.
  RMDir /r "$LOCALAPPDATA\${APP_NAME}"
  RMDir /r "$APPDATA\${APP_NAME}"
SectionEnd

; ---- command-line options (silent installs and uninstalls) -------------------------------------

Function .onInit
  ${GetParameters} $R0
  ClearErrors
  ${GetOptions} $R0 "/AUTOSTART" $R1
  ${IfNot} ${Errors}
    SectionSetFlags ${SecAutostart} ${SF_SELECTED}
  ${EndIf}
FunctionEnd

Function un.onInit
  ${GetParameters} $R0
  ClearErrors
  ${GetOptions} $R0 "/DELETEDATA" $R1
  ${IfNot} ${Errors}
    SectionSetFlags ${UnSecData} ${SF_SELECTED}
  ${EndIf}
FunctionEnd

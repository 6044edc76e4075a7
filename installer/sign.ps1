<#
.SYNOPSIS
    Authenticode-sign (or verify) Windows executables in place with signtool.

.DESCRIPTION
    installer\sign.ps1 FILE.exe [FILE.exe ...]            sign
    installer\sign.ps1 -Verify FILE.exe [FILE.exe ...]    verify (Windows trust policy)

    The certificate, from the environment (one of):
      CONVMEM_SIGN_THUMBPRINT     SHA-1 thumbprint of a code-signing certificate in the current
                                  user's store, Cert:\CurrentUser\My (where a hardware token's
                                  certificate appears too)
      CONVMEM_SIGN_PFX            a PKCS#12 file, with its password in CONVMEM_SIGN_PASSWORD_FILE
                                  (a file) or CONVMEM_SIGN_PASSWORD
    CONVMEM_SIGN_TIMESTAMP_URL    RFC 3161 timestamp server, e.g. http://timestamp.digicert.com
                                  (strongly advised: without it the signature stops validating
                                  when the certificate expires)
    CONVMEM_SIGNTOOL              signtool.exe to use (default: on PATH, else the newest
                                  Windows 10/11 SDK x64 signtool)

    convmem.nsi runs this from !finalize / !uninstfinalize (installer and uninstaller) when
    CONVMEM_SIGN_PFX or CONVMEM_SIGN_THUMBPRINT is set; build_windows.ps1 runs it for the three
    executables. Exit status 0 on success; signtool's status otherwise; 2 for a usage problem.
#>
[CmdletBinding()]
param(
    [switch]$Verify,
    [Parameter(ValueFromRemainingArguments = $true)]
    [string[]]$Files
)

$ErrorActionPreference = "Stop"
Set-StrictMode -Version Latest

function Find-SignTool {
    if ($env:CONVMEM_SIGNTOOL) { return $env:CONVMEM_SIGNTOOL }
    $onPath = Get-Command "signtool.exe" -ErrorAction SilentlyContinue
    if ($onPath) { return $onPath.Source }
    $kits = Join-Path ${env:ProgramFiles(x86)} "Windows Kits\10\bin"
    if (Test-Path $kits) {
        $found = Get-ChildItem -Path $kits -Recurse -Filter "signtool.exe" -ErrorAction SilentlyContinue |
            Where-Object { $_.FullName -match "\\x64\\" } |
            Sort-Object FullName -Descending |
            Select-Object -First 1
        if ($found) { return $found.FullName }
    }
    return $null
}

if (-not $Files -or $Files.Count -eq 0) {
    [Console]::Error.WriteLine("usage: sign.ps1 [-Verify] FILE.exe [FILE.exe ...]")
    exit 2
}
foreach ($file in $Files) {
    if (-not (Test-Path -LiteralPath $file -PathType Leaf)) {
        [Console]::Error.WriteLine("sign.ps1: no such file: $file")
        exit 2
    }
}
$signtool = Find-SignTool
if (-not $signtool) {
    [Console]::Error.WriteLine("sign.ps1: signtool.exe not found (install the Windows SDK or set CONVMEM_SIGNTOOL)")
    exit 2
}

if ($Verify) {
    & $signtool verify /pa /all /v @Files
    exit $LASTEXITCODE
}

$signArgs = @("sign", "/fd", "sha256", "/d", "ConvMem")
if ($env:CONVMEM_SIGN_THUMBPRINT) {
    $signArgs += @("/sha1", $env:CONVMEM_SIGN_THUMBPRINT)
} elseif ($env:CONVMEM_SIGN_PFX) {
    $password = $env:CONVMEM_SIGN_PASSWORD
    if ($env:CONVMEM_SIGN_PASSWORD_FILE) {
        $password = (Get-Content -LiteralPath $env:CONVMEM_SIGN_PASSWORD_FILE -Raw).TrimEnd("`r", "`n")
    }
    $signArgs += @("/f", $env:CONVMEM_SIGN_PFX)
    if ($password) { $signArgs += @("/p", $password) }
} else {
    [Console]::Error.WriteLine("sign.ps1: set CONVMEM_SIGN_THUMBPRINT or CONVMEM_SIGN_PFX")
    exit 2
}
if ($env:CONVMEM_SIGN_TIMESTAMP_URL) {
    $signArgs += @("/tr", $env:CONVMEM_SIGN_TIMESTAMP_URL, "/td", "sha256")
}

& $signtool @signArgs @Files
if ($LASTEXITCODE -ne 0) { exit $LASTEXITCODE }
foreach ($file in $Files) { Write-Output "sign.ps1: signed $file" }
exit 0

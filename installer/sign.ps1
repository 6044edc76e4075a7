<#
.SYNOPSIS
    Authenticode-sign (or verify) Windows executables in place with signtool.

.DESCRIPTION
    installer\sign.ps1 FILE.exe [FILE.exe ...]            sign
    installer\sign.ps1 -Verify FILE.exe [FILE.exe ...]    verify (Windows trust policy)

    The certificate, from the environment (one of, in this order):
      CONVMEM_SIGN_DLIB           a signtool signing plug-in (/dlib), with its metadata file in
                                  CONVMEM_SIGN_DLIB_METADATA (/dmdf). Azure Artifact Signing:
                                  Azure.CodeSigning.Dlib.dll from the NuGet package
                                  Microsoft.ArtifactSigning.Client, and a JSON file
                                  {"Endpoint", "CodeSigningAccountName", "CertificateProfileName"};
                                  it signs in the cloud as the Azure identity of the environment
                                  (AZURE_TENANT_ID / AZURE_CLIENT_ID / AZURE_CLIENT_SECRET, a
                                  managed identity or `az login`). Its timestamp server
                                  http://timestamp.acs.microsoft.com is the default.
      CONVMEM_SIGN_THUMBPRINT     SHA-1 thumbprint of a code-signing certificate in the current
                                  user's store, Cert:\CurrentUser\My (where a hardware token's
                                  certificate appears too)
      CONVMEM_SIGN_PFX            a PKCS#12 file, with its password in CONVMEM_SIGN_PASSWORD_FILE
                                  (a file) or CONVMEM_SIGN_PASSWORD
    CONVMEM_SIGN_TIMESTAMP_URL    RFC 3161 timestamp server, e.g. http://timestamp.digicert.com
                                  (strongly advised: without it the signature stops validating
                                  when the certificate expires)
    CONVMEM_SIGN_REQUIRE_TIMESTAMP=1  refuse to sign without a timestamp server (releases)
    CONVMEM_SIGNTOOL              signtool.exe to use (default: on PATH, else the newest
                                  Windows 10/11 SDK x64 signtool)

    convmem.nsi runs this from !finalize / !uninstfinalize (installer and uninstaller) when
    CONVMEM_SIGN_DLIB, CONVMEM_SIGN_THUMBPRINT or CONVMEM_SIGN_PFX is set; build_windows.ps1 runs it for the three
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
$timestampUrl = $env:CONVMEM_SIGN_TIMESTAMP_URL
if ($env:CONVMEM_SIGN_DLIB) {
    $metadata = $env:CONVMEM_SIGN_DLIB_METADATA
    if (-not $metadata -or -not (Test-Path -LiteralPath $metadata -PathType Leaf)) {
        [Console]::Error.WriteLine("sign.ps1: CONVMEM_SIGN_DLIB needs CONVMEM_SIGN_DLIB_METADATA, the plug-in's metadata file")
        exit 2
    }
    if (-not (Test-Path -LiteralPath $env:CONVMEM_SIGN_DLIB -PathType Leaf)) {
        [Console]::Error.WriteLine("sign.ps1: CONVMEM_SIGN_DLIB does not name a file")
        exit 2
    }
    $signArgs += @("/dlib", $env:CONVMEM_SIGN_DLIB, "/dmdf", $metadata)
    if (-not $timestampUrl) { $timestampUrl = "http://timestamp.acs.microsoft.com" }
} elseif ($env:CONVMEM_SIGN_THUMBPRINT) {
    $signArgs += @("/sha1", $env:CONVMEM_SIGN_THUMBPRINT)
} elseif ($env:CONVMEM_SIGN_PFX) {
    $password = $env:CONVMEM_SIGN_PASSWORD
    if ($env:CONVMEM_SIGN_PASSWORD_FILE) {
        $password = (Get-Content -LiteralPath $env:CONVMEM_SIGN_PASSWORD_FILE -Raw).TrimEnd("`r", "`n")
    }
    $signArgs += @("/f", $env:CONVMEM_SIGN_PFX)
    if ($password) { $signArgs += @("/p", $password) }
} else {
    [Console]::Error.WriteLine("sign.ps1: set CONVMEM_SIGN_DLIB, CONVMEM_SIGN_THUMBPRINT or CONVMEM_SIGN_PFX")
    exit 2
}
if ($timestampUrl) {
    $signArgs += @("/tr", $timestampUrl, "/td", "sha256")
} elseif ($env:CONVMEM_SIGN_REQUIRE_TIMESTAMP -eq "1") {
    [Console]::Error.WriteLine("sign.ps1: CONVMEM_SIGN_REQUIRE_TIMESTAMP=1 but no CONVMEM_SIGN_TIMESTAMP_URL")
    exit 2
}

& $signtool @signArgs @Files
if ($LASTEXITCODE -ne 0) { exit $LASTEXITCODE }
foreach ($file in $Files) { Write-Output "sign.ps1: signed $file" }
exit 0

<#
.SYNOPSIS
    Builds the signed ConvMem installer on Windows, from a clean checkout to
    dist\ConvMem-<version>-setup.exe.

.DESCRIPTION
    1. a build venv (build\venv, git-ignored like dist\) with `pip install .[build]`
       (PyInstaller + the app's deps);
    2. PyInstaller: installer\convmem.spec -> dist\ConvMem\ (ConvMem.exe, convmem-cli.exe,
       convmem-shim.exe, _internal\);
    3. signs the three executables (sign.ps1);
    4. smoke-tests the signed build (installer\smoke_frozen.py: serve write + read, the shim
       starting the app offscreen, quit, reread);
    5. makensis -WX installer\convmem.nsi, whose !finalize / !uninstfinalize hooks sign the
       installer and the uninstaller packed inside it;
    6. verifies every signature (signtool verify /pa) and prints sizes, SHA-256 and times.

    Needs: Python 3.11+ (x64), NSIS 3.08+ (makensis on PATH or in its default folder), the
    Windows SDK's signtool.exe. Certificate: see sign.ps1 (CONVMEM_SIGN_DLIB +
    CONVMEM_SIGN_DLIB_METADATA for Azure Artifact Signing, CONVMEM_SIGN_THUMBPRINT for a
    hardware token, or CONVMEM_SIGN_PFX + CONVMEM_SIGN_PASSWORD[_FILE];
    CONVMEM_SIGN_TIMESTAMP_URL, CONVMEM_SIGN_REQUIRE_TIMESTAMP).

.PARAMETER Python
    Interpreter that creates the venv (default: `py -3.11` when the launcher exists, else
    `python`).

.PARAMETER AllowUnsigned
    Build without a certificate (a test build; nothing is signed or verified).

.PARAMETER SkipSmoke
    Skip step 4.

.EXAMPLE
    $env:CONVMEM_SIGN_PFX = "C:\secrets\convmem.pfx"
    $env:CONVMEM_SIGN_PASSWORD_FILE = "C:\secrets\convmem.pfx.txt"
    $env:CONVMEM_SIGN_TIMESTAMP_URL = "http://timestamp.digicert.com"
    powershell -NoProfile -ExecutionPolicy Bypass -File installer\build_windows.ps1
#>
[CmdletBinding()]
param(
    [string]$Python = "",
    [switch]$AllowUnsigned,
    [switch]$SkipSmoke
)

$ErrorActionPreference = "Stop"
Set-StrictMode -Version Latest

$Root = Split-Path -Parent $PSScriptRoot
$SignScript = Join-Path $PSScriptRoot "sign.ps1"
$Clock = [Diagnostics.Stopwatch]::StartNew()
$Figures = [ordered]@{}

function Invoke-Native {
    param([string]$Exe, [string[]]$Arguments)
    Write-Host "> $Exe $($Arguments -join ' ')"
    & $Exe @Arguments
    if ($LASTEXITCODE -ne 0) { throw "$Exe exited with status $LASTEXITCODE" }
}

function Invoke-Sign {
    param([string[]]$Arguments)
    Invoke-Native "powershell.exe" (@("-NoProfile", "-ExecutionPolicy", "Bypass", "-File", $SignScript) + $Arguments)
}

function Measure-Step {
    param([string]$Name, [scriptblock]$Body)
    $step = [Diagnostics.Stopwatch]::StartNew()
    & $Body
    $Figures["$Name (s)"] = [math]::Round($step.Elapsed.TotalSeconds, 1)
}

function Find-Makensis {
    $onPath = Get-Command "makensis.exe" -ErrorAction SilentlyContinue
    if ($onPath) { return $onPath.Source }
    foreach ($base in @(${env:ProgramFiles(x86)}, $env:ProgramFiles)) {
        if ($base) {
            $candidate = Join-Path $base "NSIS\makensis.exe"
            if (Test-Path $candidate) { return $candidate }
        }
    }
    throw "makensis.exe not found: install NSIS 3.08 or later (e.g. choco install nsis)"
}

Push-Location $Root
try {
    $match = Select-String -Path "pyproject.toml" -Pattern '^version = "([0-9]+\.[0-9]+\.[0-9]+)"' |
        Select-Object -First 1
    if (-not $match) { throw "pyproject.toml: no numeric x.y.z [project] version" }
    $Version = $match.Matches[0].Groups[1].Value
    $Signing = [bool]($env:CONVMEM_SIGN_DLIB -or $env:CONVMEM_SIGN_PFX -or $env:CONVMEM_SIGN_THUMBPRINT)
    if (-not $Signing -and -not $AllowUnsigned) {
        throw ("no certificate: set CONVMEM_SIGN_DLIB (+ CONVMEM_SIGN_DLIB_METADATA), " +
            "CONVMEM_SIGN_THUMBPRINT or CONVMEM_SIGN_PFX (+ CONVMEM_SIGN_PASSWORD_FILE), " +
            "or pass -AllowUnsigned for a test build")
    }
    $Makensis = Find-Makensis
    Write-Host "ConvMem $Version, signing: $Signing"

    # 1. the build venv
    $Venv = Join-Path $Root "build\venv"
    $Py = Join-Path $Venv "Scripts\python.exe"
    Measure-Step "venv + pip install" {
        if (-not (Test-Path $Py)) {
            if ($Python) { Invoke-Native $Python @("-m", "venv", $Venv) }
            elseif (Get-Command "py.exe" -ErrorAction SilentlyContinue) {
                Invoke-Native "py.exe" @("-3.11", "-m", "venv", $Venv)
            }
            else { Invoke-Native "python.exe" @("-m", "venv", $Venv) }
        }
        Invoke-Native $Py @("-m", "pip", "install", "--upgrade", "pip")
        Invoke-Native $Py @("-m", "pip", "install", ".[build]")
    }

    # 2. PyInstaller
    $Dist = Join-Path $Root "dist\ConvMem"
    if (Test-Path $Dist) { Remove-Item -Recurse -Force $Dist }
    Measure-Step "pyinstaller" {
        Invoke-Native $Py @("-m", "PyInstaller", "--noconfirm", "--clean", "--distpath", "dist",
            "--workpath", "build\pyinstaller", "installer\convmem.spec")
    }
    $Exes = @("ConvMem.exe", "convmem-cli.exe", "convmem-shim.exe") | ForEach-Object { Join-Path $Dist $_ }

    # 3. sign the executables (before the smoke test: it then runs the signed files)
    if ($Signing) { Measure-Step "sign executables" { Invoke-Sign $Exes } }

    # 4. smoke test
    if (-not $SkipSmoke) {
        Measure-Step "smoke test" { Invoke-Native $Py @("installer\smoke_frozen.py", $Dist, "--timings", "20") }
    }

    # 5. the installer (signed with its uninstaller by the NSIS hooks when a certificate is set)
    $Setup = Join-Path $Root "dist\ConvMem-$Version-setup.exe"
    if (Test-Path $Setup) { Remove-Item -Force $Setup }
    $NsisArgs = @("-WX", "-DVERSION=$Version", "-DDIST=$Dist", "-DOUTFILE=$Setup")
    if (-not $Signing) { $NsisArgs += "-DNOSIGN" }
    Measure-Step "makensis" { Invoke-Native $Makensis ($NsisArgs + @("installer\convmem.nsi")) }

    # 6. verify
    if ($Signing) {
        Measure-Step "verify" { Invoke-Sign (@("-Verify") + $Exes + @($Setup)) }
    }

    $distBytes = (Get-ChildItem -Recurse -File $Dist | Measure-Object -Property Length -Sum).Sum
    $Figures["dist\ConvMem (MB)"] = [math]::Round($distBytes / 1MB, 1)
    $Figures["installer (MB)"] = [math]::Round((Get-Item $Setup).Length / 1MB, 1)
    foreach ($exe in $Exes) {
        $Figures["$(Split-Path -Leaf $exe) (MB)"] = [math]::Round((Get-Item $exe).Length / 1MB, 2)
    }
    $Figures["total (s)"] = [math]::Round($Clock.Elapsed.TotalSeconds, 1)
    $Figures["installer SHA-256"] = (Get-FileHash -Algorithm SHA256 $Setup).Hash
    Write-Host ""
    Write-Host "Built $Setup"
    $Figures.GetEnumerator() | ForEach-Object { Write-Host ("  {0,-28} {1}" -f $_.Key, $_.Value) }
}
finally {
    Pop-Location
}

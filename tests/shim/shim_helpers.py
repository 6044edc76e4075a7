"""Windows' command-line splitting, for checking our quoting on any platform."""

from __future__ import annotations


def split_windows_command_line(line: str) -> list[str]:
    """Split a command line the way CommandLineToArgvW and the Microsoft C runtime do: the
    program name runs to the next quote (when it starts with one) or the next blank, with no
    escapes; then blanks separate arguments outside quotes, 2n backslashes before a quote are n
    backslashes and the quote toggles quoting, 2n+1 are n and a literal quote, other
    backslashes are literal, and `""` inside quotes is a literal quote.
    (`test_our_splitter_agrees_with_windows` compares it with the real call on Windows.)"""
    args: list[str] = []
    i, n = 0, len(line)
    if line.startswith('"'):
        end = line.find('"', 1)
        end = n if end < 0 else end
        args.append(line[1:end])
        i = end + 1
    else:
        while i < n and line[i] not in " \t":
            i += 1
        args.append(line[:i])
    while True:
        while i < n and line[i] in " \t":
            i += 1
        if i >= n:
            return args
        current: list[str] = []
        quoted = False
        while i < n and (quoted or line[i] not in " \t"):
            if line[i] == "\\":
                start = i
                while i < n and line[i] == "\\":
                    i += 1
                count = i - start
                if i < n and line[i] == '"':
                    current.append("\\" * (count // 2))
                    if count % 2:
                        current.append('"')
                        i += 1
                    continue
                current.append("\\" * count)
                continue
            if line[i] == '"':
                if quoted and i + 1 < n and line[i + 1] == '"':
                    current.append('"')
                    i += 2
                    continue
                quoted = not quoted
                i += 1
                continue
            current.append(line[i])
            i += 1
        args.append("".join(current))


# Arguments that break naive quoting: blanks, quotes, backslashes before quotes and at the
# end, percent signs (not expanded in REG_SZ), shell metacharacters, non-ASCII, empty.
AWKWARD_ARGUMENTS = [
    r"C:\Users\Zoë O'Brien\AppData\Local\ConvMem",
    r"D:\memories with spaces\\",
    "D:\\trailing backslash\\",
    'say "hi"',
    r"back\"slash",
    "%LOCALAPPDATA%\\ConvMem",
    "a&b|c^d<e>f",
    "tab\there",
    "",
    "日本語のメモ",
]
